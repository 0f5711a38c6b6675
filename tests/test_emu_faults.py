"""Every fault inside an emulated kernel becomes an EmuError that names the kernel, the block,
the thread and the source line, and the Python process goes on: after each fault, a healthy
kernel of the same module still runs and gives the right answer."""

import os
import signal
import threading

import numpy as np
import pytest

from ckptlab import emu

pytestmark = pytest.mark.counted  # byte counts, bounds and race checks

FAULTS = r"""
extern "C" __global__ void healthy(float* x, int n) {
    __shared__ float s[64];
    const int t = threadIdx.x;
    s[t] = t < n ? x[t] : 0.0f;
    __syncthreads();                                        // line 6
    if (t < n) x[t] = s[t] + s[(t + 1) % blockDim.x];
}
extern "C" __global__ void early_exit_barrier(float* x) {
    if (threadIdx.x < 16) return;
    __syncthreads();                                        // line 11
    x[threadIdx.x] = 1.0f;
}
extern "C" __global__ void divergent_barriers(float* x) {
    if (threadIdx.x % 2) {
        __syncthreads();                                    // line 16
    } else {
        __syncthreads();                                    // line 18
    }
}
extern "C" __global__ void shuffle_with_exited_lane(float* x) {
    if (threadIdx.x == 5) return;
    x[threadIdx.x] = __shfl_sync(0xffffffffu, x[threadIdx.x], 0);   // line 23
}
extern "C" __global__ void write_past_end(float* out, int n) {
    out[threadIdx.x] = 1.0f;                                // line 26: threads >= n write past
}
extern "C" __global__ void read_before_start(const float* in, float* out) {
    out[threadIdx.x] = in[(int)threadIdx.x - 1];            // line 29
}
extern "C" __global__ void shared_race(float* out) {
    __shared__ float s;
    s = (float)threadIdx.x;                                 // line 33: everyone writes s
    out[threadIdx.x] = s;
}
extern "C" __global__ void big_locals(float* out, int n) {
    volatile float local[96 * 1024 / 4];                    // 96 KiB of stack
    for (int i = 0; i < n; ++i) local[i] = (float)i;
    out[threadIdx.x] = local[n - 1];
}
extern "C" __global__ void spin_forever(volatile int* flag) {
    while (flag[0] == 0) { }                                // line 42: nobody sets it
}
extern "C" __global__ void divide(int* x, int d) { x[threadIdx.x] = 100 / d; }
extern "C" __global__ void null_deref(float* x) { float* p = nullptr; x[0] = p[threadIdx.x]; }
extern "C" __global__ void asserts(const float* x) { assert(x[threadIdx.x] >= 0.0f); }
extern "C" __global__ void mixed_warp_ops(int* x) {
    if (threadIdx.x < 16) x[threadIdx.x] = __shfl_sync(0xffffffffu, 1, 0);
    else x[threadIdx.x] = __ballot_sync(0xffffffffu, 1);
}
extern "C" __global__ void ldg_past_end(const float* in, float* out) {
    out[threadIdx.x] = __ldg(in + threadIdx.x + 1);         // line 52: the last reads past
}
"""


@pytest.fixture(scope="module")
def mod():
    return emu.RawModule(code="#include <cassert>\n" + FAULTS, name="faults.cu")


def healthy_still_runs(mod):
    x = np.arange(40, dtype=np.float32)
    mod.get_function("healthy")((1,), (64,), (x, np.int32(40)))
    ref = np.arange(40, dtype=np.float32)
    s = np.concatenate([ref, np.zeros(24, np.float32)])
    assert np.array_equal(x, ref + s[(np.arange(40) + 1) % 64])


def expect_fault(mod, kernel, grid, block, args, match, line=None, **kw):
    with pytest.raises(emu.EmuError, match=match) as info:
        mod.get_function(kernel)(grid, block, args, **kw)
    err = info.value
    assert err.kernel == kernel and kernel in str(err)
    assert err.block is not None and "block (" in str(err)
    if line is not None:
        assert err.line == line and f"faults.cu:{line}" in str(err), str(err)
    healthy_still_runs(mod)
    return err


def test_barrier_reached_by_some_threads(mod):
    err = expect_fault(mod, "early_exit_barrier", (1,), (64,), (np.zeros(64, np.float32),),
                       r"reached by 48 of 64 threads; the other 16 exited", line=12)
    assert err.kind == "barrier" and err.thread is not None


def test_threads_at_different_barriers(mod):
    expect_fault(mod, "divergent_barriers", (2,), (32,), (np.zeros(64, np.float32),),
                 r"different __syncthreads: .*faults.cu:19.*faults.cu:17")


def test_warp_op_with_an_exited_lane(mod):
    err = expect_fault(mod, "shuffle_with_exited_lane", (1,), (32,),
                       (np.zeros(32, np.float32),), r"lane 5", line=24)
    assert err.kind == "warp"


def test_mixed_warp_operations(mod):
    expect_fault(mod, "mixed_warp_ops", (1,), (32,), (np.zeros(32, np.int32),),
                 r"different warp operations: __shfl_sync .* __ballot_sync")


def test_write_just_past_the_end_of_an_argument(mod):
    out = np.zeros(30, np.float32)
    err = expect_fault(mod, "write_past_end", (1,), (32,), (out, np.int32(30)),
                       r"out-of-bounds write of 4 bytes .* past the end of argument 'out'",
                       line=27)
    assert err.thread == (30, 0, 0)  # the first thread past the end
    assert err.kind == "access"


def test_read_just_before_the_start_of_an_argument(mod):
    err = expect_fault(mod, "read_before_start", (1,), (8,),
                       (np.ones(8, np.float32), np.zeros(8, np.float32)),
                       r"out-of-bounds read of 4 bytes .* 4 bytes before the start of argument "
                       r"'in'", line=30)
    assert err.thread == (0, 0, 0)


def test_a_fault_inside_an_inlined_emulator_helper_names_the_kernels_line(mod):
    """__ldg is the emulator's inline function (shim.h): the read past the end happens in its
    body, and the report names the kernel's line that called it, not shim.h."""
    err = expect_fault(mod, "ldg_past_end", (1,), (8,),
                       (np.ones(8, np.float32), np.zeros(8, np.float32)),
                       r"out-of-bounds read of 4 bytes .* past the end of argument 'in'",
                       line=53)
    assert "shim.h" not in str(err) and err.thread == (7, 0, 0)


def test_shared_memory_race_between_barriers(mod):
    err = expect_fault(mod, "shared_race", (1,), (32,), (np.zeros(32, np.float32),),
                       r"shared-memory race: this thread writes .* thread \(0,0,0\) wrote",
                       line=34)
    assert err.kind == "race" and err.thread == (1, 0, 0)


def test_race_check_can_be_turned_off(mod):
    out = np.full(32, np.nan, np.float32)
    with emu.settings(race_check=False):
        mod.get_function("shared_race")((1,), (32,), (out,))
    assert np.array_equal(out, np.arange(32))  # ran to the end: threads in order, no barrier
    expect_fault(mod, "shared_race", (1,), (32,), (out,), r"shared-memory race", line=34)


def test_fiber_stack_overflow_then_a_bigger_stack(mod):
    out = np.zeros(4, np.float32)
    n = np.int32(96 * 1024 // 4)
    with emu.settings(stack_kib=emu.DEFAULT):  # 64 KiB, whatever CKPTLAB_EMU_STACK_KIB says
        err = expect_fault(mod, "big_locals", (1,), (4,), (out, n),
                           r"fiber stack overflow.*64 KiB")
    assert err.kind == "stack"
    with emu.settings(stack_kib=256):
        mod.get_function("big_locals")((1,), (4,), (out, n))
    assert np.array_equal(out, np.full(4, n - 1, np.float32))


def test_runaway_kernel_is_stopped_by_the_watchdog(mod):
    with emu.settings(watchdog_s=0.3):
        err = expect_fault(mod, "spin_forever", (1,), (1,), (np.zeros(1, np.int32),),
                           r"watchdog: the launch ran longer than 0.3 s")
    assert err.kind == "watchdog"


def test_ctrl_c_interrupts_a_launch(mod, ctrl_c_raises):
    main = threading.get_ident()
    timer = threading.Timer(0.3, lambda: signal.pthread_kill(main, signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt, match="interrupted"):
        mod.get_function("spin_forever")((1,), (1,), (np.zeros(1, np.int32),))
    timer.join()
    healthy_still_runs(mod)


def test_a_process_that_ignores_ctrl_c_keeps_ignoring_it_in_a_launch(mod):
    main = threading.get_ident()
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        timer = threading.Timer(0.2, lambda: signal.pthread_kill(main, signal.SIGINT))
        timer.start()
        with emu.settings(watchdog_s=1.0), pytest.raises(emu.EmuError, match="watchdog"):
            mod.get_function("spin_forever")((1,), (1,), (np.zeros(1, np.int32),))
        timer.join()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
    healthy_still_runs(mod)


def test_integer_division_by_zero(mod):
    expect_fault(mod, "divide", (1,), (4,), (np.zeros(4, np.int32), np.int32(0)),
                 r"SIGFPE.*division by zero", line=45)


def test_null_pointer(mod):
    expect_fault(mod, "null_deref", (1,), (4,), (np.zeros(4, np.float32),),
                 r"out-of-bounds read|invalid memory access")


def test_assert_in_a_kernel(mod):
    x = np.ones(8, np.float32)
    x[3] = -1
    err = expect_fault(mod, "asserts", (1,), (8,), (x,), r"assertion failed: x\[threadIdx.x\]")
    assert err.thread == (3, 0, 0)


# ---- launches refused before anything runs -------------------------------------------------
def test_wrong_number_of_arguments(mod):
    with pytest.raises(emu.EmuArgumentError, match=r"takes 2 arguments \(float\* x, int n\)"):
        mod.get_function("healthy")((1,), (64,), (np.zeros(4, np.float32),))


def test_python_scalar_for_a_32_bit_parameter(mod):
    with pytest.raises(emu.EmuArgumentError, match=r"argument 1 \(int n\) must be np.int32"):
        mod.get_function("healthy")((1,), (64,), (np.zeros(4, np.float32), 4))
    with pytest.raises(TypeError, match="np.int32"):  # also a TypeError
        mod.get_function("healthy")((1,), (64,), (np.zeros(4, np.float32), np.int64(4)))


@pytest.mark.parametrize("bad,match", [
    (np.zeros(8, np.float64), r"dtype float32, got float64"),
    (np.zeros((8, 8), np.float32).T, r"C-contiguous"),
    (np.zeros(8, np.float32)[::2], r"C-contiguous"),
    ([0.0] * 8, r"must be a NumPy array, got list"),
])
def test_wrong_array_arguments(mod, bad, match):
    with pytest.raises(emu.EmuArgumentError, match=match):
        mod.get_function("healthy")((1,), (64,), (bad, np.int32(8)))


def test_read_only_array_for_a_written_pointer(mod):
    x = np.zeros(8, np.float32)
    x.flags.writeable = False
    with pytest.raises(emu.EmuArgumentError, match="read-only"):
        mod.get_function("healthy")((1,), (64,), (x, np.int32(8)))


@pytest.mark.parametrize("grid,block,match", [
    ((1,), (1025,), r"block\[0\] = 1025 is outside \[1, 1024\]"),
    ((1,), (64, 32), r"2048 threads; at most 1024"),
    ((0,), (32,), r"grid\[0\] = 0"),
    ((1,), (1, 1, 65), r"block\[2\] = 65"),
    ((1, 2, 3, 4), (1,), r"1 to 3 dimensions"),
])
def test_bad_launch_shapes(mod, grid, block, match):
    with pytest.raises(emu.EmuError, match=match):
        mod.get_function("healthy")(grid, block, (np.zeros(8, np.float32), np.int32(8)))
    healthy_still_runs(mod)


def test_unknown_kernel_name(mod):
    with pytest.raises(AttributeError, match="no kernel 'nope' in faults.cu"):
        mod.get_function("nope")


def test_cupy_array_is_refused_on_the_emulator(mod):
    class FakeCupyArray:  # what matters is the module the type comes from
        __module__ = "cupy._core.core"

    with pytest.raises(emu.EmuArgumentError, match="CuPy"):
        mod.get_function("healthy")((1,), (64,), (FakeCupyArray(), np.int32(8)))


def test_compile_error_shows_the_compiler_output():
    bad = 'extern "C" __global__ void k(float* x) {\n  x[0] = 1.0f\n}\n'
    with pytest.raises(emu.EmuCompileError, match=r"broken.cu:2:.*expected ';'") as info:
        emu.RawModule(code=bad, name="broken.cu").get_function("k")
    assert "compiling broken.cu" in str(info.value)


def test_no_compiler_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", "no-such-compiler-xyz")
    monkeypatch.setenv("CKPTLAB_CACHE_DIR", str(tmp_path))
    with pytest.raises(emu.EmuCompileError, match=r"needs g\+\+ >= 10 to build.*apt install g\+\+"):
        emu.RawModule(code='extern "C" __global__ void k() {}', name="k.cu").get_function("k")


def test_process_survives_every_fault_in_one_run(mod):
    """The whole catalogue in a row, then a healthy launch: nothing leaked between them."""
    cases = [("early_exit_barrier", (1,), (64,), (np.zeros(64, np.float32),)),
             ("write_past_end", (1,), (32,), (np.zeros(30, np.float32), np.int32(30))),
             ("shared_race", (1,), (32,), (np.zeros(32, np.float32),)),
             ("divide", (1,), (4,), (np.zeros(4, np.int32), np.int32(0)))]
    for name, grid, block, args in cases * 3:
        with pytest.raises(emu.EmuError):
            mod.get_function(name)(grid, block, args)
    healthy_still_runs(mod)
    assert os.getpid() > 0
