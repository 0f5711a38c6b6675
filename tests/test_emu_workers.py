"""Blocks on several workers (OS threads) give what one worker gives: every kernel of kernels/
the same outputs and exactly the same counts; atomics stay atomic under heavy collisions; a
fault in one block stops every worker and names its block, thread and line; the watchdog and
Ctrl-C stop any number of workers, and 200 short launches with Ctrl-C sent among them neither
hang nor lose one."""

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import astuple

import ml_dtypes
import numpy as np
import pytest

from ckptlab import device, emu, kernels
from ckptlab.kernels import flash_tc

pytestmark = pytest.mark.counted  # byte counts, bounds and race checks

WMMA = "wmma_gemm<__nv_bfloat16>"
MANY = 3  # more workers than this machine's 2 cores: blocks really interleave


def counts(rec):
    return [(x.kernel, x.threads, x.blocks, {n: astuple(a) for n, a in x.args.items()},
             x.shared_read_bytes, x.shared_write_bytes, x.shared_atomics) for x in rec.launches]


def attention(q, k, v, dO, causal, deterministic):
    _, s1 = kernels.naive_forward(q, k, v, causal=causal, dropout_p=0.1, seed=5)
    naive = kernels.naive_backward(dO, q, k, v, s1)
    O3, s3 = kernels.stored_forward(q, k, v, causal=causal, dropout_p=0.1, seed=5)
    stored = kernels.stored_backward(dO, q, k, v, s3, deterministic=deterministic)
    O, s2 = kernels.flash_forward(q, k, v, causal=causal, dropout_p=0.1, seed=5)
    flash = kernels.flash_backward(dO, q, k, v, s2, deterministic=deterministic)
    # (the atomic dQ last: the one output that may differ in its rounding)
    return [s1.tensors["P"], *naive, O3, s3.tensors["S"], *stored, O, s2.tensors["L"], *flash]


@pytest.mark.parametrize("mode", ["counted", "fast"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("B,H,Nq,Nk,d", [(1, 2, 17, 40, 16), (2, 1, 100, 33, 32)])
def test_every_attention_kernel_matches_one_worker(mode, causal, B, H, Nq, Nk, d):
    rng = np.random.default_rng()
    q, dO = (rng.standard_normal((B, H, Nq, d), dtype=np.float32) for _ in range(2))
    k, v = (rng.standard_normal((B, H, Nk, d), dtype=np.float32) for _ in range(2))
    runs = {}
    for workers in (1, MANY):
        for det in (True, False):
            with emu.settings(mode=mode, workers=workers), emu.record() as rec:
                runs[workers, det] = attention(q, k, v, dO, causal, det), counts(rec)
    for det in (True, False):
        (one, c1), (many, cm) = runs[1, det], runs[MANY, det]
        assert c1 == cm  # every count, argument by argument, launch by launch
        atomic_dq = () if det else (6, len(one) - 3)  # stored's dQ, flash's dQ
        for i, (a, b) in enumerate(zip(one, many, strict=True)):
            if i not in atomic_dq:  # all bitwise, the deterministic dQ included
                assert np.array_equal(a, b, equal_nan=True), i
            else:  # dQ by atomicAdd: floats summed in another order
                assert np.allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["flash", "stored"])
@pytest.mark.parametrize("causal", [False, True])
def test_the_tensor_core_kernels_match_one_worker(method, causal):
    """The tensor-core pair (wmma's warp-collective exchanges on every worker at once)."""
    B, H, Nq, Nk, d = 1, 2, 40, 33, 32
    rng = np.random.default_rng()
    q, dO = (rng.standard_normal((B, H, Nq, d)).astype(ml_dtypes.bfloat16) for _ in range(2))
    k, v = (rng.standard_normal((B, H, Nk, d)).astype(ml_dtypes.bfloat16) for _ in range(2))
    runs = {}
    for workers in (1, MANY):
        with emu.settings(workers=workers), emu.record() as rec:
            O, saved = flash_tc.tc_forward(method, q, k, v, causal=causal, dropout_p=0.1, seed=3)
            det = flash_tc.tc_backward(dO, q, k, v, saved, deterministic=True)
            atomic = flash_tc.tc_backward(dO, q, k, v, saved, deterministic=False)
        runs[workers] = [O, saved.tensors["L"], *det, *atomic[1:]], atomic[0], counts(rec)
    (one, dq1, c1), (many, dqm, cm) = runs[1], runs[MANY]
    assert c1 == cm
    for i, (a, b) in enumerate(zip(one, many, strict=True)):
        assert np.array_equal(a.view(np.uint16) if a.dtype.itemsize == 2 else a,
                              b.view(np.uint16) if b.dtype.itemsize == 2 else b), i
    assert np.allclose(dq1.astype(np.float32), dqm.astype(np.float32), rtol=2e-2, atol=2e-2)


def test_wmma_gemm_matches_one_worker():
    M, N, K = 40, 50, 36
    rng = np.random.default_rng()
    A = rng.standard_normal((M, K)).astype(ml_dtypes.bfloat16)
    Bm = rng.standard_normal((K, N)).astype(ml_dtypes.bfloat16)
    f = device.load("wmma_gemm.cu", name_expressions=(WMMA,)).get_function(WMMA)
    out = {}
    for workers in (1, MANY):
        C = np.full((M, N), np.nan, np.float32)
        with emu.settings(workers=workers), emu.record() as rec:
            f((-(-N // 16), -(-M // 16)), (32,), (A, Bm, C, np.int32(M), np.int32(N), np.int32(K)))
        out[workers] = C, counts(rec)
    assert np.array_equal(out[1][0], out[MANY][0]) and out[1][1] == out[MANY][1]
    assert np.allclose(out[1][0], A.astype(np.float64) @ Bm.astype(np.float64), rtol=1e-5,
                       atol=1e-4)


@pytest.mark.parametrize("M,N,K", [(17, 33, 5), (100, 37, 129)])
def test_sgemm_and_softmax_match_one_worker(M, N, K):
    rng = np.random.default_rng()
    A, Bm = rng.random((M, K), np.float32), rng.random((K, N), np.float32)
    x = rng.standard_normal((M, N), dtype=np.float32)
    sgemm = device.load("sgemm_tiled.cu").get_function("sgemm_tiled")
    softmax = device.load("softmax_rows.cu").get_function("softmax_rows")
    out = {}
    for workers in (1, MANY):
        C, y = np.full((M, N), np.nan, np.float32), np.full_like(x, np.nan)
        with emu.settings(workers=workers), emu.record() as rec:
            sgemm((-(-N // 16), -(-M // 16)), (16, 16),
                  (A, Bm, C, np.int32(M), np.int32(N), np.int32(K)))
            softmax((-(-M // 4),), (128,), (x, y, np.int32(M), np.int32(N)))
        out[workers] = C, y, counts(rec)
    assert np.array_equal(out[1][0], out[MANY][0]) and np.array_equal(out[1][1], out[MANY][1])
    assert out[1][2] == out[MANY][2]


ATOMICS = r"""
extern "C" __global__ void histogram(const int* v, int* bins, unsigned long long* total,
                                     float* fsum, int* mx, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    atomicAdd(&bins[v[i] & 7], 1);                 // 8 bins: every thread collides
    atomicAdd(total, (unsigned long long)v[i]);
    atomicAdd(fsum, 0.5f);                         // exact in float below 2^24
    atomicMax(mx, v[i]);
}
extern "C" __global__ void sum_without_atomics(const float* x, float* total) {
    if (threadIdx.x == 0) total[0] += x[blockIdx.x];   // line 12: blocks race
}
extern "C" __global__ void one_bad_block(float* out, int bad) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i + (blockIdx.x == bad && threadIdx.x == 7 ? 1 << 20 : 0)] = 1.0f;   // line 16
}
extern "C" __global__ void divide_or_spin(volatile int* x, int bad) {
    if (blockIdx.x == bad && threadIdx.x == 0) x[1] = 100 / x[0];          // line 19: x[0] = 0
    while (x[2] == 0) { }                                                   // line 20
}
extern "C" __global__ void where(int* out) {
    out[blockIdx.x * blockDim.x + threadIdx.x] = blockIdx.x;
}
"""


@pytest.fixture(scope="module")
def mod():
    return emu.RawModule(code=ATOMICS, name="workers.cu")


@pytest.mark.parametrize("mode", ["counted", "fast"])
def test_atomics_under_heavy_collisions(mod, mode):
    n = 256 * 128
    v = np.random.default_rng().integers(0, 1 << 20, n).astype(np.int32)
    for _ in range(3):
        bins, total = np.zeros(8, np.int32), np.zeros(1, np.uint64)
        fsum, mx = np.zeros(1, np.float32), np.zeros(1, np.int32)
        with emu.settings(mode=mode, workers=MANY):
            launch = mod.get_function("histogram")((256,), (128,),
                                                   (v, bins, total, fsum, mx, np.int32(n)))
        assert bins.tolist() == np.bincount(v & 7, minlength=8).tolist()
        assert int(total[0]) == int(v.astype(np.int64).sum())
        assert fsum[0] == n * 0.5 and mx[0] == v.max()
        if mode == "counted":
            assert launch.args["bins"].atomic_ops == n and launch.atomic_ops == 4 * n


def test_a_race_between_blocks_on_different_workers_is_found(mod):
    with emu.settings(workers=MANY), pytest.raises(emu.EmuError, match=r"global-memory race: .*"
                                                   r"argument 'total'.*another block") as e:
        mod.get_function("sum_without_atomics")((64,), (32,), (np.ones(64, np.float32),
                                                               np.zeros(1, np.float32)))
    assert e.value.kind == "race" and e.value.line == 12


def test_a_fault_in_one_block_stops_every_worker_and_names_it(mod):
    out = np.zeros(64 * 32, np.float32)
    for bad in (0, 37, 63):
        with emu.settings(workers=MANY), pytest.raises(emu.EmuError) as e:
            mod.get_function("one_bad_block")((64,), (32,), (out, np.int32(bad)))
        assert e.value.block == (bad, 0, 0) and e.value.thread == (7, 0, 0)
        assert e.value.kernel == "one_bad_block"
        assert e.value.kind == "access" and e.value.line == 16
    with emu.settings(workers=MANY):  # the next launch runs
        mod.get_function("one_bad_block")((64,), (32,), (out, np.int32(-1)))
    assert (out == 1).all()


@pytest.mark.parametrize("mode", ["counted", "fast"])
def test_a_fault_stops_workers_spinning_in_other_blocks(mod, mode):
    x = np.zeros(4, np.int32)  # x[2] == 0: every other thread spins for ever
    t0 = time.monotonic()
    with emu.settings(mode=mode, workers=MANY), pytest.raises(emu.EmuError, match="SIGFPE") as e:
        mod.get_function("divide_or_spin")((8,), (32,), (x, np.int32(1)))  # among the first
    assert time.monotonic() - t0 < 30  # stopped, not the 120 s watchdog
    assert e.value.block == (1, 0, 0) and e.value.thread == (0, 0, 0) and e.value.line == 19


@pytest.mark.parametrize("mode", ["counted", "fast"])
def test_the_watchdog_stops_every_worker(mod, mode):
    x = np.array([1, 0, 0, 0], np.int32)  # no division fault: everyone spins
    with emu.settings(mode=mode, workers=MANY, watchdog_s=0.3), \
            pytest.raises(emu.EmuError, match="watchdog") as e:
        mod.get_function("divide_or_spin")((8,), (32,), (x, np.int32(-1)))
    assert e.value.kind == "watchdog" and e.value.line == 20 and e.value.file == "workers.cu"


def test_shuffled_blocks_on_many_workers_run_each_block_once(mod):
    out = np.full(50 * 16, -1, np.int32)
    with emu.settings(workers=MANY, block_order="shuffled"):
        mod.get_function("where")((50,), (16,), (out,))
    assert np.array_equal(out, np.repeat(np.arange(50), 16))


def test_no_deadlock_in_200_short_launches_with_ctrl_c_among_them(mod, ctrl_c_raises):
    """A helper thread sends SIGINT at a random moment into every tenth launch; each one must
    come back as exactly one KeyboardInterrupt (raised inside a launch or just after it), and
    nothing may hang."""
    f = mod.get_function("where")
    out = np.zeros(8 * 32, np.int32)
    rng = np.random.default_rng()
    main, sent, received = threading.get_ident(), [], 0
    t0 = time.monotonic()
    with emu.settings(workers=MANY):
        for launch in range(200):
            if launch % 10 != 5:
                f((8,), (32,), (out,))
                continue
            timer = threading.Timer(float(rng.uniform(0, 0.002)), lambda: (
                sent.append(1), signal.pthread_kill(main, signal.SIGINT)))
            t1 = time.monotonic()
            try:
                timer.start()
                while time.monotonic() - t1 < 10:  # short launches until the Ctrl-C lands
                    f((8,), (32,), (out,))
                pytest.fail("a Ctrl-C was lost")
            except KeyboardInterrupt:
                received += 1
            timer.join()
    assert len(sent) == received == 20
    assert time.monotonic() - t0 < 120
    assert np.array_equal(out, np.repeat(np.arange(8), 32))


def test_automatic_workers_wake_only_for_launches_big_enough(mod):
    """Automatic workers (the default): one per CPU for a launch of at least AUTO_MIN_THREADS
    threads (no more than its blocks), the calling thread alone below; a number asked for is
    used as asked."""
    cpus, small, big = emu.config.cpus(), (8,), (emu.config.AUTO_MIN_THREADS // 32,)
    out = np.zeros(big[0] * 32, np.int32)
    with emu.settings(workers=emu.DEFAULT):  # automatic, whatever CKPTLAB_EMU_WORKERS says
        assert mod.get_function("where")(small, (32,), (out,)).workers == 1
        assert mod.get_function("where")(big, (32,), (out,)).workers == min(cpus, big[0])
    with emu.settings(workers=MANY):
        assert mod.get_function("where")(small, (32,), (out,)).workers == MANY
    with emu.settings(workers=1):
        assert mod.get_function("where")(big, (32,), (out,)).workers == 1
    assert np.array_equal(out, np.repeat(np.arange(big[0]), 32))


def test_workers_setting_and_environment():
    assert emu.Settings().workers is None  # automatic: one per CPU for big enough launches
    with pytest.raises(ValueError, match=r"workers must be None \(one per CPU\) or an int in "
                                         r"\[1, 256\], got 0"):
        emu.configure(workers=0)
    with pytest.raises(ValueError, match="workers must be None"):
        emu.configure(workers=1.5)
    code = "from ckptlab import emu; print(emu.current().workers)"
    env = dict(os.environ, CKPTLAB_EMU_WORKERS="3")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "3", out.stderr
    env["CKPTLAB_EMU_WORKERS"] = "many"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "CKPTLAB_EMU_WORKERS='many': expected an integer" in out.stderr


@pytest.mark.parametrize("text, on", [("0", False), ("FALSE", False), (" off ", False),
                                      ("No", False), ("1", True), ("True", True), ("yes", True),
                                      ("ON", True)])
def test_race_check_from_the_environment_in_any_case(monkeypatch, text, on):
    """Every spelling the command line accepts means the same to the emulator itself (FALSE
    used to turn the check on: only lower-case "false" was read as off)."""
    monkeypatch.setenv("CKPTLAB_EMU_RACE_CHECK", text)
    assert emu.config.from_environment().race_check is on


def test_an_unreadable_race_check_value_is_refused_by_the_emulator(monkeypatch):
    monkeypatch.setenv("CKPTLAB_EMU_RACE_CHECK", "maybe")
    with pytest.raises(ValueError, match=r"CKPTLAB_EMU_RACE_CHECK='maybe': expected one of 1, "):
        emu.config.from_environment()
