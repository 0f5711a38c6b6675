"""Every head dim FlashAttention takes (multiples of 8 up to 256): the table that maps d to a tile
head dim and tiles within 48 KiB of shared memory, and the three methods on one small shape per
head dim against float64, by test_attention.py's rule (<= 1e-5 relative, <= 2x float32 NumPy's
error). Head dims 40, 80, 96, 160, 192, 256 are common in models (GPT-J, Falcon, Llama...); the
ones that are not a tile head dim (8, 24, 40, 80, 200) run on zero-padded tiles."""

import numpy as np
import pytest

from ckptlab import device, emu, kernels
from ckptlab.kernels import table

HEAD_DIMS = (8, 16, 24, 40, 64, 80, 96, 128, 160, 192, 200, 256)


@pytest.fixture(autouse=True, scope="module")
def on_the_emulator():
    with device.use("emu"):
        yield


def test_every_head_dim_has_a_tile_head_dim_and_tiles_that_fit():
    """tile_head_dim(d) is the smallest tile head dim >= d; the default tiles of each fit the
    static 48 KiB (the limit the emulator and ptxas enforce), meet the kernels' static_asserts
    (multiples of LANES; a row group per warp; Br <= Bc * LANES in the backward), and a block
    has at most 512 threads."""
    assert table.HEAD_DIMS == tuple(range(8, 257, 8)) and table.MAX_HEAD_DIM == 256
    for d in table.HEAD_DIMS:
        D = table.tile_head_dim(d)
        assert D >= d and not any(d <= t < D for t in table.TILE_HEAD_DIMS)
        (fBr, fBc), (bBr, bBc) = table.fwd_tiles(d), table.bwd_tiles(d)
        assert table.flash_fwd_shared_bytes(d, fBr, fBc) <= table.SHARED_LIMIT == 48 * 1024
        assert table.flash_bwd_shared_bytes(d, bBr, bBc) <= table.SHARED_LIMIT
        for t in (fBr, fBc, bBr, bBc):
            assert t % table.LANES == 0
        assert fBr % 4 == 0 and bBc % 4 == 0 and bBr <= bBc * table.LANES
        assert max(fBr, bBr, bBc) * table.LANES <= 512
    for bad in (0, 4, 12, 264, 512):
        with pytest.raises(ValueError, match=f"multiple of 8 in \\[8, 256\\], got d={bad}"):
            table.tile_head_dim(bad)


def test_instantiations_cover_every_tile_head_dim_once():
    """What `python -m ckptlab kernels` compiles: per tile head dim, the forward for flash and
    stored; the dK/dV kernel for both methods and both dQ modes, the dq kernel for both."""
    fwd, bwd = table.instantiations("attn_flash_fwd.cu"), table.instantiations("attn_flash_bwd.cu")
    assert len(fwd) == len(set(fwd)) == 2 * len(table.TILE_HEAD_DIMS)
    assert len(bwd) == len(set(bwd)) == 6 * len(table.TILE_HEAD_DIMS)
    for d in table.HEAD_DIMS:
        Br, Bc = table.fwd_tiles(d)
        assert {table.fwd_name(d, Br, Bc, s) for s in (False, True)} <= set(fwd)
        Br, Bc = table.bwd_tiles(d)
        assert {table.dq_name(d, Br, Bc, s) for s in (False, True)} <= set(bwd)
        assert {table.dkdv_name(d, Br, Bc, det, s) for det in (False, True)
                for s in (False, True)} <= set(bwd)


def case(n: int, d: int):
    """A small shape per head dim: Nq != Nk both ways, tails on every tile, causal and dropout
    alternating (B*H = 2, so batch offsets are exercised)."""
    Nq, Nk = ((19, 33), (40, 17), (9, 70))[n % 3]
    return 1, 2, Nq, Nk, d, n % 2 == 1, (0.0, 0.2)[n // 2 % 2]


@pytest.mark.parametrize("n,d", list(enumerate(HEAD_DIMS)), ids=[f"d{d}" for d in HEAD_DIMS])
def test_three_methods_at_every_head_dim(n, d):
    from test_attention import run_case

    run_case(case(n, d), seed=n)


def test_padded_columns_never_reach_global_memory():
    """d = 40 runs on 64-wide tiles: every output is written once, element by element (counted
    write bytes == its size: a store to a padded column would add bytes, or fault past the
    end), and no element is left unwritten (the NaN poison is gone)."""
    from test_attention import make_inputs

    q, k, v, dO = make_inputs(1, 1, 33, 21, 40, 1)
    for method in ("stored", "flash"):
        with emu.settings(mode="counted"), emu.record() as rec:
            O, saved = kernels.forward(method, q, k, v, causal=True)
            grads = kernels.backward(method, dO, q, k, v, saved, deterministic=True)
        assert np.isfinite(O).all() and all(np.isfinite(g).all() for g in grads)
        writes = {}
        for launch in rec.launches:
            for name, a in launch.args.items():
                writes[name] = writes.get(name, 0) + a.write_bytes
        assert writes["O"] == O.nbytes and writes["dQ"] == grads[0].nbytes
        assert writes["dK"] == grads[1].nbytes and writes["dV"] == grads[2].nbytes
