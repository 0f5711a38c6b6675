"""The attention kernels of the three methods on the emulator against the float64 reference and
PyTorch.

For each shape: naive forward/backward; for stored and for flash (the same fused kernels, S
stored or recomputed) the forward and the backward with atomic dQ and with the deterministic dQ
(twice: bitwise equal). Each output (O, L, dQ, dK, dV) must be within
    relative Frobenius error <= 1e-5 of float64 truth       (fp32: ~1e-7 per op, N and d sums)
    and <= 2x the error of the same math in float32 NumPy   (FlashAttention's rule)
plus FLOOR: one fp32 rounding of the result (2^-22 relative), for outputs the float32 NumPy
path happens to get exact (e.g. N = 1, where O is V itself). Outputs are NaN-poisoned by the
wrappers, so an element no thread writes fails here. Time: ~30 s on 2 cores (B*H <= 2).
Every other head dim (8..256, padded tiles): tests/test_attention_head_dims.py.
"""

import numpy as np
import pytest

from ckptlab import device, emu, kernels
from ckptlab import reference as ref

TOL = 1e-5
FLOOR = 2.0**-22
EPS32 = float(np.finfo(np.float32).eps)


@pytest.fixture(autouse=True, scope="module")
def on_the_emulator():
    with device.use("emu"):
        yield


# (B, H, Nq, Nk, d, causal, dropout_p). Every head dim meets every (causal, dropout) pair; the
# (Nq, Nk) pairs cycle through N in {1, 17, 64, 100, 257} with Nq < Nk and Nq > Nk (causal with
# Nq > Nk: rows that see no key); B*H alternates 1 and 2 (batch offsets, dropout indices).
PAIRS = [(1, 100), (17, 17), (257, 64), (64, 257), (100, 17), (17, 100), (257, 257), (100, 64)]
OPTIONS = [(False, 0.0), (True, 0.0), (False, 0.2), (True, 0.3)]
GRID_DIMS = (16, 32, 64, 128)  # the tile head dims of the labs; the others: _head_dims.py
GRID = [(d, causal, p) for d in GRID_DIMS for causal, p in OPTIONS]
CASES = [(1, 1 + n % 2, *PAIRS[n % len(PAIRS)], d, causal, p)
         for n, (d, causal, p) in enumerate(GRID)]
CASES += [
    (1, 1, 1, 1, 16, False, 0.0),  # one query, one key
    (1, 1, 257, 1, 64, False, 0.0),  # one key per row: exact dQ = dK = 0 (see check())
    (1, 2, 1, 100, 32, True, 0.0),  # one query, bottom-right aligned: it sees every key
    (2, 1, 257, 100, 16, True, 0.15),  # 157 rows that see no key, with dropout
    (1, 1, 64, 17, 128, True, 0.5),
]


def case_id(c):
    B, H, Nq, Nk, d, causal, p = c
    return f"BH{B * H}-Nq{Nq}-Nk{Nk}-d{d}-{'causal' if causal else 'full'}-p{p}"


def make_inputs(B, H, Nq, Nk, d, seed):
    g = np.random.default_rng(seed)
    q, k, v, dO = (g.standard_normal(s).astype(np.float32)
                   for s in ((B, H, Nq, d), (B, H, Nk, d), (B, H, Nk, d), (B, H, Nq, d)))
    return q, k, v, dO


def rel(x, y):
    return float(np.linalg.norm(np.asarray(x, np.float64) - y) / np.linalg.norm(y))


def check(name, x, truth, fp32, zero_bound=0.0):
    """x (kernel, fp32) against truth (float64) and fp32 (the same math in float32 NumPy).
    Where the exact answer is 0 (dQ, dK when every row sees one key), bound ||x|| instead by
    zero_bound, the rounding of the two fp32 sums whose difference should cancel."""
    x = device.to_numpy(x)
    assert np.all(np.isfinite(x)), f"{name}: NaN or inf (an unwritten element stays NaN)"
    norm = np.linalg.norm(truth)
    if norm == 0:
        assert np.linalg.norm(x) <= zero_bound, f"{name}: exact answer is 0"
        return
    err, err32 = rel(x, truth), rel(fp32, truth)
    assert err <= TOL, f"{name}: relative error {err:.2e} > {TOL}"
    assert err <= 2 * err32 + FLOOR, f"{name}: error {err:.2e} > 2x float32 NumPy's {err32:.2e}"


def check_L(name, L, truth, fp32):
    """L = m + log l; +inf exactly where a row sees no key."""
    L = device.to_numpy(L)
    assert np.array_equal(np.isposinf(L), np.isposinf(truth)), f"{name}: +inf rows differ"
    fin = np.isfinite(truth)
    if fin.any():
        check(name, L[fin], truth[fin], fp32[fin])


def truths(q, k, v, dO, causal, p, seed, offset, dtype, scale=None):
    O, L = ref.forward(q, k, v, causal, scale, p, seed, offset, dtype=dtype)
    grads = ref.backward(dO, q, k, v, causal, scale, p, seed, offset, dtype=dtype)
    return O, L, grads


def zero_bounds(q, k, v, dO):
    """For Nk = 1: dS_i = P_i (dP_i - D_i) with dP_i and D_i two fp32 sums of the same d
    products dO_ic V_c: |dS| <= 2 d eps ||dO|| ||V||, so ||dQ|| <= scale ||dS|| ||K|| (dK: Q)."""
    d = q.shape[-1]
    ds = 2 * d * EPS32 * np.linalg.norm(dO) * np.linalg.norm(v)
    return ds * np.linalg.norm(k) / np.sqrt(d), ds * np.linalg.norm(q) / np.sqrt(d)


def run_case(c, xp=np, seed=0):
    """All kernels on one shape; returns nothing, asserts everything."""
    B, H, Nq, Nk, d, causal, p = c
    q, k, v, dO = make_inputs(B, H, Nq, Nk, d, seed)
    seed_rng, offset = 1234 + seed, 7
    O64, L64, g64 = truths(q, k, v, dO, causal, p, seed_rng, offset, np.float64)
    O32, L32, g32 = truths(q, k, v, dO, causal, p, seed_rng, offset, np.float32)
    zb = zero_bounds(q, k, v, dO)
    bounds = (zb[0], zb[1], 0.0)
    qd, kd, vd, dOd = (xp.asarray(a) for a in (q, k, v, dO))
    kw = dict(causal=causal, dropout_p=p, seed=seed_rng, offset=offset)

    O, saved = kernels.naive_forward(qd, kd, vd, **kw)
    check("naive O", O, O64, O32)
    grads = kernels.naive_backward(dOd, qd, kd, vd, saved)
    for name, g, t, t32, zb in zip(("dQ", "dK", "dV"), grads, g64, g32, bounds, strict=True):
        check(f"naive {name}", g, t, t32, zb)

    for method in ("stored", "flash"):
        O, saved = kernels.forward(method, qd, kd, vd, **kw)
        check(f"{method} O", O, O64, O32)
        check_L(f"{method} L", saved.tensors["L"], L64, L32)
        for deterministic in (False, True):
            grads = kernels.backward(method, dOd, qd, kd, vd, saved, deterministic)
            for name, g, t, t32, zb in zip(("dQ", "dK", "dV"), grads, g64, g32, bounds,
                                           strict=True):
                check(f"{method} {name} (deterministic={deterministic})", g, t, t32, zb)
        # Bitwise run to run, whatever order the blocks run in (shuffled, as a GPU may order them)
        with emu.settings(block_order="shuffled"):
            again = kernels.backward(method, dOd, qd, kd, vd, saved, deterministic=True)
        for name, a, b in zip(("dQ", "dK", "dV"), grads, again, strict=True):
            assert np.array_equal(device.to_numpy(a), device.to_numpy(b)), f"{method} {name}"
    return O, grads


@pytest.mark.parametrize("c", CASES, ids=case_id)
def test_kernels_match_float64_reference(c):
    run_case(c)


def test_atomic_dq_depends_on_the_block_order_and_deterministic_does_not():
    """Nine K/V tiles add into every dQ row. With blocks in random orders the atomic sums
    round differently (bits differ run to run, values agree); the deterministic kernel's do not."""
    q, k, v, dO = make_inputs(1, 2, 40, 257, 32, 5)
    _, saved = kernels.flash_forward(q, k, v)
    runs = {False: [], True: []}
    for seed in range(6):
        with emu.settings(block_order="shuffled", block_seed=seed):
            for det in runs:
                runs[det].append(kernels.flash_backward(dO, q, k, v, saved, det)[0].copy())
    atomic, deterministic = runs[False], runs[True]
    assert any(not np.array_equal(atomic[0], a) for a in atomic[1:])
    assert all(np.allclose(atomic[0], a, rtol=1e-5, atol=1e-6 * np.abs(atomic[0]).max())
               for a in atomic[1:])
    assert all(np.array_equal(deterministic[0], a) for a in deterministic[1:])


@pytest.mark.parametrize("c", [CASES[7], CASES[11]], ids=case_id)
def test_kernels_match_torch_autograd(c, torch):
    """PyTorch float64 autograd as an independent oracle (its own masked softmax)."""
    from test_reference import torch_attention

    B, H, Nq, Nk, d, causal, p = c
    q, k, v, dO = make_inputs(B, H, Nq, Nk, d, 3)
    O_t, L_t, g_t = torch_attention(*(a.astype(np.float64) for a in (q, k, v, dO)), causal,
                                    1 / np.sqrt(d), p, 5, 0)
    for method in kernels.METHODS:
        O, saved = getattr(kernels, f"{method}_forward")(q, k, v, causal=causal,
                                                           dropout_p=p, seed=5)
        grads = getattr(kernels, f"{method}_backward")(dO, q, k, v, saved)
        assert rel(O, O_t) <= TOL, method
        for g, t in zip(grads, g_t, strict=True):
            assert rel(g, t) <= TOL, method


@pytest.mark.parametrize("tiles", [(16, 32), (32, 8), (8, 16)])
def test_other_tile_sizes(tiles):
    """Br != Bc, both ways, with tails on both axes, causal and dropout: the tile-pair skipping
    and the row/column bookkeeping must not depend on the default tiles."""
    q, k, v, dO = make_inputs(1, 1, 45, 70, 32, 4)
    kw = dict(causal=True, dropout_p=0.2, seed=9, offset=1)
    O64, L64, g64 = truths(q, k, v, dO, True, 0.2, 9, 1, np.float64)
    for method in ("stored", "flash"):
        O, saved = getattr(kernels, f"{method}_forward")(q, k, v, **kw, tiles=tiles)
        assert rel(O, O64) <= TOL and rel(saved.tensors["L"], L64) <= TOL
        for deterministic in (False, True):
            grads = getattr(kernels, f"{method}_backward")(dO, q, k, v, saved, deterministic,
                                                            tiles=tiles)
            for g, t in zip(grads, g64, strict=True):
                assert rel(g, t) <= TOL


def test_large_scores_do_not_overflow():
    """|S| ~ 1e4 (head 0: +1e4, head 1: -1e4, plus O(1) differences): exp(S) alone would be
    inf (or 0/0). The inputs make S exact in fp32 (multiples of 1/64 below 2^24), so the
    softmax's own accuracy is what is measured.

    Forward (O, L) and the naive backward (which keeps P) keep their usual accuracy. The
    stored and flash backwards cannot: they form P = exp(S - L) from L stored in fp32, and
    L ~ 1e4 is only known to |L| * 2^-24 ~ 6e-4, which becomes the relative error of P and of
    the gradients (measured ~3e-4 here). That is FlashAttention's own trade (its L is fp32
    too); the bound below is that rounding, |L| * eps."""
    g = np.random.default_rng(5)
    B, H, Nq, Nk, d = 1, 2, 40, 33, 32
    q = (g.integers(-8, 9, (B, H, Nq, d)) / 8).astype(np.float32)
    k = (g.integers(-8, 9, (B, H, Nk, d)) / 8).astype(np.float32)
    q[..., 0], k[..., 0] = 100.0, 0.0
    k[:, 0, :, 0], k[:, 1, :, 0] = 100.0, -100.0  # S = +-1e4 + (an exact multiple of 1/64)
    v, dO = (g.standard_normal(s).astype(np.float32) for s in ((B, H, Nk, d), (B, H, Nq, d)))
    O64, L64, g64 = truths(q, k, v, dO, False, 0.0, 0, 0, np.float64, scale=1.0)
    O32, L32, g32 = truths(q, k, v, dO, False, 0.0, 0, 0, np.float32, scale=1.0)
    assert np.abs(L64).min() > 9e3
    for method in kernels.METHODS:
        O, saved = getattr(kernels, f"{method}_forward")(q, k, v, scale=1.0)
        check(f"{method} O", O, O64, O32)
        if method != "naive":
            check_L(f"{method} L", saved.tensors["L"], L64, L32)
        slack = FLOOR if method == "naive" else np.abs(L64).max() * EPS32
        grads = getattr(kernels, f"{method}_backward")(dO, q, k, v, saved)
        for name, g_, t, t32 in zip(("dQ", "dK", "dV"), grads, g64, g32, strict=True):
            x = device.to_numpy(g_)
            assert np.all(np.isfinite(x)), f"{method} {name}"
            # dQ's column 0 is 100 * sum_j dS_ij = 0 in exact math, a cancellation every fp32
            # order pays for: the yardstick is float32 NumPy's error, not 1e-5
            err, err32 = rel(x, t), rel(t32, t)
            assert err <= 2 * err32 + slack, f"{method} {name}: {err:.1e} vs {err32:.1e}"


def test_saved_ledger():
    """naive keeps P (N x N); flash keeps exactly O and L (B, H, Nq)."""
    q, k, v, _ = make_inputs(2, 1, 30, 50, 16, 6)
    _, naive = kernels.naive_forward(q, k, v)
    _, flash = kernels.flash_forward(q, k, v, causal=True, dropout_p=0.1, seed=3, offset=2)
    assert set(naive.tensors) == {"P"} and naive.nbytes == 2 * 30 * 50 * 4
    assert set(flash.tensors) == {"O", "L"}
    assert flash.tensors["L"].shape == (2, 1, 30) and flash.tensors["L"].dtype == np.float32
    assert flash.nbytes == 2 * 30 * (16 + 1) * 4
    assert (flash.causal, flash.dropout_p, flash.seed, flash.offset) == (True, 0.1, 3, 2)


def test_dropout_depends_on_seed_and_offset():
    """Changing (seed, offset) changes O; the same pair reproduces it exactly."""
    q, k, v, _ = make_inputs(1, 1, 20, 20, 16, 7)
    a, _ = kernels.flash_forward(q, k, v, dropout_p=0.5, seed=1, offset=0)
    b, _ = kernels.flash_forward(q, k, v, dropout_p=0.5, seed=1, offset=0)
    c, _ = kernels.flash_forward(q, k, v, dropout_p=0.5, seed=1, offset=1)
    d, _ = kernels.flash_forward(q, k, v, dropout_p=0.5, seed=2, offset=0)
    assert np.array_equal(a, b) and not np.allclose(a, c) and not np.allclose(a, d)


# ---- bad input: the right error, and nothing launched ---------------------------------------
def _good():
    q, k, v, dO = make_inputs(1, 2, 9, 11, 16, 8)
    return dict(q=q, k=k, v=v), dO


class _FakeCupy:
    """Stands in for a CuPy array (none can be made without a GPU)."""

    __module__ = "cupy._core.core"
    dtype, ndim, shape = np.dtype(np.float32), 4, (1, 2, 9, 16)


BAD_FORWARD = [
    ("q", lambda a: a["q"].astype(np.float64), TypeError, "dtype float32"),
    ("k", lambda a: a["k"][0], ValueError, "rank 4"),
    ("k", lambda a: np.ascontiguousarray(a["k"][:, :1]), ValueError, "match q"),
    ("v", lambda a: a["v"][..., :8].copy(), ValueError, "shape of k"),
    ("q", lambda a: a["q"][:, :, ::-1], ValueError, "contiguous"),  # same shape, a view
    ("q", lambda a: _FakeCupy(), TypeError, "numpy array on the 'emu' target"),
    ("q", lambda a: a["q"].tolist(), TypeError, "numpy array"),
]


@pytest.mark.parametrize("method", kernels.METHODS)
@pytest.mark.parametrize("arg,bad,error,message", BAD_FORWARD,
                         ids=[f"{b[0]}-{b[3]}" for b in BAD_FORWARD])
def test_bad_forward_input(method, arg, bad, error, message):
    args, _ = _good()
    args[arg] = bad(args)
    with emu.record() as rec, pytest.raises(error, match=message) as info:
        getattr(kernels, f"{method}_forward")(**args)
    assert arg in str(info.value) and rec.launches == []


@pytest.mark.parametrize("method", kernels.METHODS)
@pytest.mark.parametrize("kwargs,message", [
    (dict(dropout_p=1.0), "dropout_p"), (dict(dropout_p=-0.1), "dropout_p"),
    (dict(scale=float("nan")), "scale"), (dict(seed=-1), "seed"), (dict(causal="yes"), "causal"),
])
def test_bad_forward_options(method, kwargs, message):
    args, _ = _good()
    with emu.record() as rec, pytest.raises((ValueError, TypeError), match=message):
        getattr(kernels, f"{method}_forward")(**args, **kwargs)
    assert rec.launches == []


@pytest.mark.parametrize("shape,message", [
    ((1, 1, 9, 12), r"multiple of 8 in \[8, 256\], got d=12"), ((1, 1, 9, 264), "got d=264"),
    ((1, 1, 0, 16), "must be >= 1")])
def test_bad_sizes(shape, message):
    x = np.zeros(shape, np.float32)
    for method in kernels.METHODS:
        with emu.record() as rec, pytest.raises(ValueError, match=message):
            getattr(kernels, f"{method}_forward")(x, x, x)
        assert rec.launches == []


def test_bad_tiles_and_shared_memory_budget():
    args, _ = _good()
    with emu.record() as rec:
        with pytest.raises(ValueError, match="multiple of 8"):
            kernels.flash_forward(**args, tiles=(12, 16))
        with pytest.raises(ValueError, match="shared memory"):
            kernels.flash_forward(**{n: np.zeros((1, 1, 9, 128), np.float32) for n in args},
                                    tiles=(64, 64))
    assert rec.launches == []
    q = np.zeros((1, 1, 9, 16), np.float32)
    _, saved = kernels.flash_forward(q, q, q)
    with emu.record() as rec:  # fits shared memory, but the kernel needs Br <= Bc * LANES
        with pytest.raises(ValueError, match=r"Br must be at most Bc \* 8 = 64"):
            kernels.flash_backward(q, q, q, q, saved, tiles=(128, 8))
    assert rec.launches == []


def test_bad_backward_input():
    args, dO = _good()
    q, k, v = args["q"], args["k"], args["v"]
    _, naive = kernels.naive_forward(q, k, v)
    _, flash = kernels.flash_forward(q, k, v)
    with emu.record() as rec:
        with pytest.raises(ValueError, match="dO must have shape"):
            kernels.flash_backward(dO[:, :, :5].copy(), q, k, v, flash)
        with pytest.raises(TypeError, match="saved must be what flash_forward returned"):
            kernels.flash_backward(dO, q, k, v, naive)
        with pytest.raises(TypeError, match="saved must be what naive_forward returned"):
            kernels.naive_backward(dO, q, k, v, flash)
        with pytest.raises(ValueError, match="saved was made for"):
            kernels.flash_backward(dO[:, :, :4].copy(), q[:, :, :4].copy(), k, v, flash)
        with pytest.raises(TypeError, match="dO must have dtype float32"):
            kernels.naive_backward(dO.astype(np.float16), q, k, v, naive)
    assert rec.launches == []


@pytest.mark.counted
def test_flash_shared_memory_is_seen_by_the_emulator():
    q, k, v, dO = make_inputs(1, 1, 40, 40, 16, 9)
    with emu.record() as rec:
        _, saved = kernels.flash_forward(q, k, v)
        kernels.flash_backward(dO, q, k, v, saved, deterministic=True)
    for launch in rec.launches:
        if "preprocess" not in launch.kernel:
            assert launch.shared_read_bytes > 0 and launch.shared_write_bytes > 0, launch.kernel


def test_unpoisoned_gives_the_same_results_and_restores_the_poison():
    """Benchmarks time without the NaN fills; the kernels write every element either way."""
    q, k, v, dO = make_inputs(1, 1, 17, 33, 16, 3)
    O, saved = kernels.flash_forward(q, k, v)
    with kernels.unpoisoned():
        O2, saved2 = kernels.flash_forward(q, k, v)
        g2 = kernels.flash_backward(dO, q, k, v, saved2, deterministic=True)
    g = kernels.flash_backward(dO, q, k, v, saved, deterministic=True)
    assert np.array_equal(O, O2) and all(np.array_equal(a, b) for a, b in zip(g, g2, strict=True))
    assert np.isnan(kernels.common.poisoned((3,))).all()  # the poison is back
