"""Counted mode counts a global access on one of two paths: the common case (one argument alone
in its region, in bounds, allowed, no race check) before anything else, everything else in
full. Both must give the same counts: every kernel family is run with the race check (the full
path for every access) and without it, and every count of every launch must agree; a fault
stays a fault without the race check."""

import numpy as np
import pytest

from ckptlab import device, emu
from ckptlab.kernels import flash, naive
from ckptlab.kernels.table import SGEMM_TILE as TILE


def counts(rec):
    return [(x.kernel, x.threads, x.shared_read_bytes, x.shared_write_bytes,
             {name: tuple(vars(t).values()) for name, t in x.args.items()})
            for x in rec.launches]


def both_ways(work):
    out = []
    for race in (True, False):
        with device.use("emu"), emu.settings(mode="counted", race_check=race), \
                emu.record() as rec:
            work()
        out.append(counts(rec))
    return out


def test_sgemm_counts_agree_on_both_paths():
    rng = np.random.default_rng()
    M, N, K = 37, 21, 45
    A = rng.standard_normal((M, K), dtype=np.float32)
    B = rng.standard_normal((K, N), dtype=np.float32)
    C = np.full((M, N), np.nan, np.float32)

    def work():
        f = device.load("sgemm_tiled.cu").get_function("sgemm_tiled")
        f((-(-N // TILE), -(-M // TILE)), (TILE, TILE),
          (A, B, C, np.int32(M), np.int32(N), np.int32(K)))

    full, common = both_ways(work)
    assert full == common
    assert full[0][4]["A"][0] == M * K * 4 * -(-N // TILE)  # counted bytes, as the file says


@pytest.mark.parametrize("causal", [False, True])
def test_attention_counts_agree_on_both_paths(causal):
    rng = np.random.default_rng()
    q, k, v, dO = (rng.standard_normal((1, 2, 19, 24)).astype(np.float32) for _ in range(4))

    def work():
        _, saved = naive.naive_forward(q, k, v, causal=causal)
        naive.naive_backward(dO, q, k, v, saved)
        _, saved = flash.flash_forward(q, k, v, causal=causal)
        flash.flash_backward(dO, q, k, v, saved)  # dQ by atomicAdd: atomics take the full path
        flash.flash_backward(dO, q, k, v, saved, deterministic=True)

    full, common = both_ways(work)
    assert len(full) >= 10 and full == common


OOB = r"""
extern "C" __global__ void past_the_end(const float* x, float* y, int n) {
    y[threadIdx.x] = x[threadIdx.x + n];
}
extern "C" __global__ void into_const(const float* x, float* y) {
    ((float*)x)[threadIdx.x] = y[threadIdx.x];
}
"""


@pytest.mark.parametrize("race", [True, False])
def test_faults_stay_faults_without_the_race_check(race):
    mod = emu.RawModule(code=OOB, name="paths.cu")
    x, y = np.zeros(32, np.float32), np.zeros(32, np.float32)
    with emu.settings(mode="counted", race_check=race):
        with pytest.raises(emu.EmuError, match=r"out-of-bounds read of 4 bytes"):
            mod.get_function("past_the_end")((1,), (32,), (x, y, np.int32(1)))
        with pytest.raises(emu.EmuError, match=r"const"):
            mod.get_function("into_const")((1,), (32,), (x, y))
