"""Unique bytes (the distinct bytes a launch touches: what an infinite cache would move, a lower
bound on DRAM traffic) against counted bytes (every request, no cache: an upper bound), per
kernel argument: the emulator's unique counts equal traffic's unique model exactly, and are at
most the counted ones, for every kernel of the three methods and the lab 01 examples."""

import numpy as np
import pytest
from traffic_check import counted_unique, inputs, modeled_unique

from ckptlab import device, emu, kernels
from ckptlab.measure import traffic

pytestmark = pytest.mark.counted  # every test here reads byte counts


@pytest.fixture(autouse=True, scope="module")
def on_the_emulator():
    with device.use("emu"), emu.settings(mode="counted"):
        yield


SHAPES = [  # (B, H, Nq, Nk, d, causal): tails, Nq > Nk causal (Q tiles no key sees), padded d
    (1, 1, 1, 1, 16, False),
    (2, 1, 17, 40, 32, True),
    (1, 2, 100, 17, 64, True),
    (1, 1, 45, 70, 40, False),
    (1, 1, 64, 257, 16, True),
]


def run_all(method, B, H, Nq, Nk, d, causal, deterministic):
    q, k, v, dO = inputs(B, H, Nq, Nk, d)
    kw = dict(causal=causal, dropout_p=0.1, seed=3)
    with emu.record() as rec:
        _, saved = kernels.forward(method, q, k, v, **kw)
        kernels.backward(method, dO, q, k, v, saved, deterministic)
    return rec


@pytest.mark.parametrize("B,H,Nq,Nk,d,causal", SHAPES)
@pytest.mark.parametrize("variant", traffic.VARIANTS)
def test_unique_bytes_equal_the_model(variant, B, H, Nq, Nk, d, causal):
    method, det = variant.removesuffix("-det"), variant.endswith("-det")
    rec = run_all(method, B, H, Nq, Nk, d, causal, det)
    model = traffic.launches(variant, B, H, Nq, Nk, d, causal)
    assert counted_unique(rec) == modeled_unique(model)
    assert rec.global_unique_bytes == traffic.totals(model)["unique_bytes"]


@pytest.mark.parametrize("B,H,Nq,Nk,d,causal", SHAPES)
def test_unique_is_at_most_counted(B, H, Nq, Nk, d, causal):
    """Per argument and launch, on the emulator: unique read (written) <= counted read
    (written) + atomic bytes."""
    for variant in traffic.VARIANTS:
        method, det = variant.removesuffix("-det"), variant.endswith("-det")
        for launch in run_all(method, B, H, Nq, Nk, d, causal, det).launches:
            for name, a in launch.args.items():
                assert a.unique_read_bytes <= a.read_bytes + a.atomic_bytes, (launch.kernel,
                                                                              name)
                assert a.unique_write_bytes <= a.write_bytes + a.atomic_bytes, (launch.kernel,
                                                                                name)


@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (33, 17, 40), (64, 48, 16)])
def test_lab01_examples_unique_and_counted_equal_the_model(M, N, K):
    """kernels/sgemm_tiled.cu and kernels/softmax_rows.cu (labs/01): both byte counts."""
    from ckptlab.kernels.table import SGEMM_TILE, SOFTMAX_ROWS_PER_BLOCK

    g = np.random.default_rng(1)
    A, B = g.random((M, K), np.float32), g.random((K, N), np.float32)
    C = np.full((M, N), np.nan, np.float32)
    T = SGEMM_TILE
    with emu.record() as rec:
        device.load("sgemm_tiled.cu").get_function("sgemm_tiled")(
            (-(-N // T), -(-M // T)), (T, T), (A, B, C, np.int32(M), np.int32(N), np.int32(K)))
        device.load("softmax_rows.cu").get_function("softmax_rows")(
            (-(-M // SOFTMAX_ROWS_PER_BLOCK),), (32 * SOFTMAX_ROWS_PER_BLOCK,),
            (A, np.empty_like(A), np.int32(M), np.int32(K)))
    models = [traffic.sgemm_tiled(M, N, K), traffic.softmax_rows(M, K)]
    assert counted_unique(rec) == modeled_unique(models)


def test_model_unique_at_most_counted_at_scale():
    """The two models at sizes the emulator would take minutes for (N = 1024, 4096; d = 64, 128,
    256), causal and not: unique <= counted per argument, and equal for the arguments touched
    once (O, L and dK, dV written once; S read once by each stored backward kernel)."""
    for N in (1024, 4096):
        for d in (64, 128, 256):
            for causal in (False, True):
                for variant in traffic.VARIANTS:
                    for m in traffic.launches(variant, 1, 1, N, N, d, causal):
                        for n in m.read:
                            assert m.unique_read[n] <= m.read[n], (m.kernel, n)
                            assert m.unique_write[n] <= m.write[n], (m.kernel, n)
                            assert m.unique_atomic[n] <= 4 * m.atomics[n], (m.kernel, n)
                        if m.kernel.startswith(("attn_flash_bwd_dkdv", "attn_flash_bwd_dq")):
                            assert m.unique_read["S"] == m.read["S"]


def test_unique_n_by_n_bytes_of_the_three_methods():
    """What an infinite cache would still move of the N x N arrays, N = 1024, d = 64, forward +
    backward, one launch at a time: naive writes S, P, dP, dS once each and reads them in 1, 3,
    1 and 2 later launches (11 N^2 floats); stored writes S once and reads it once (atomic dQ)
    or twice (deterministic: dkdv and dq each); flash moves nothing N x N."""
    N, d, nn = 1024, 64, 1024 * 1024 * 4

    def n_by_n(variant):
        return sum(m.unique_read.get(n, 0) + m.unique_write.get(n, 0)
                   for m in traffic.launches(variant, 1, 1, N, N, d)
                   for n in ("S", "P", "dP", "dS"))

    assert n_by_n("naive") == 11 * nn
    assert n_by_n("stored") == 2 * nn and n_by_n("stored-det") == 3 * nn
    assert n_by_n("flash") == n_by_n("flash-det") == 0
