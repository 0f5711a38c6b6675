"""The instruments: wall time and peak memory (HBM bytes measured by Nsight Compute: ncu.py).

- time_fn: CUDA events on the "cuda" target (warm-up calls excluded, so compilation is too; L2
  flushed before each repeat; the stream held by a spinning kernel while fn is queued, so host
  overhead is not timed), time.perf_counter on the CPU; median and spread of the repeats.
- peak_memory: the most bytes held at once while fn runs, over what was held before it: the CuPy
  memory pool's used bytes on a GPU, tracemalloc (which sees NumPy's buffers) on the CPU.
- blas_threads: limit the BLAS and OpenMP thread pools in this process (threadpoolctl), so that a
  CPU timing does not swing with whatever else the machine's cores are doing; time_fn uses it.
- quartiles: median and interquartile range of samples, the spread every CPU timing is shown with.
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
import tracemalloc
from dataclasses import dataclass

import numpy as np

from ckptlab import device

# ----------------------------------------------------------------------------- timers


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one function: median, 10th/90th percentiles, the relative spread
    (p90 - p10) / median, every sample, the device it ran on and how it was timed."""

    median_s: float
    p10_s: float
    p90_s: float
    spread: float
    samples_s: tuple
    device: str
    method: str


@contextlib.contextmanager
def blas_threads(n: int = 1):
    """Within the block, BLAS (OpenBLAS, MKL, BLIS) and OpenMP use at most `n` threads, set
    in-process through threadpoolctl (environment variables such as OPENBLAS_NUM_THREADS only
    act before NumPy is imported). One thread per process: a 2-core machine shared with other
    work then gives repeatable medians; the limit is lifted on exit."""
    from threadpoolctl import threadpool_limits

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n: expected an int >= 1, got {n!r}")
    with threadpool_limits(limits=n):
        yield


def quartiles(samples) -> tuple[float, float, float]:
    """(median, 25th percentile, 75th percentile) of `samples` (seconds, or any numbers)."""
    s = np.asarray(samples, dtype=np.float64)
    if s.ndim != 1 or s.size == 0 or not np.all(np.isfinite(s)):
        raise ValueError(f"samples: expected a non-empty 1-D sequence of finite numbers, got "
                         f"{np.asarray(samples).tolist()}")
    q2, q1, q3 = np.percentile(s, [50, 25, 75])
    return float(q2), float(q1), float(q3)


def _cpu_label() -> str:
    return f"cpu ({platform.machine() or 'unknown'}, {os.cpu_count()} cores)"


def time_fn(fn, *, repeats: int = 20, warmup: int = 2, flush_l2: bool = True, target=None,
            hold_stream: bool = True):
    """Time `fn()` `repeats` times after `warmup` untimed calls (run-time compilation and first
    touches happen there). On "cuda": CUDA events around each call, with a write of twice the L2
    size before each so every repeat starts with a cold cache. On the CPU: perf_counter, with
    the BLAS threads limited to one (blas_threads); the CPU caches are not flushed (flush_l2
    applies to the GPU's L2 only).

    On "cuda", a one-thread kernel holds the stream while fn is called (nvbench's blocking
    kernel): at small sizes the host's work per call (checks, allocation, 3 to 8 launches) takes
    longer than the kernels, and without the hold the events would time the host. fn must only
    queue work: one that waits for the GPU (a .get(), a sync) is released after HOLD_GUARD_S and
    its repeats are flagged in the method as including host time. hold_stream=False times the
    call as the host drives it (an end-to-end step whose Python is part of its cost)."""
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats: expected an int >= 1, got {repeats!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup: expected an int >= 0, got {warmup!r}")
    if (target or device.target()) == "cuda":
        samples, label, how = _time_cuda(fn, repeats, warmup, flush_l2, hold_stream)
    else:
        samples = []
        with blas_threads(1):
            for _ in range(warmup):
                fn()
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - t0)
        label, how = _cpu_label(), "time.perf_counter, BLAS on 1 thread"
    s = np.asarray(samples, dtype=np.float64)
    median, p10, p90 = (float(v) for v in np.percentile(s, [50, 10, 90]))
    method = f"{how}, median of {repeats} after {warmup} warm-up call(s)"
    spread = (p90 - p10) / median if median > 0 else float("nan")
    return Timing(median, p10, p90, spread, tuple(float(v) for v in s), label, method)


# Holds the stream until the host has queued fn's whole call (nvbench's "blocking kernel"): the
# start event then fires with every launch of fn already queued, so host work (argument checks,
# allocation, Python) cannot show up as GPU time. flag[0]: set by the host to release; flag[1]:
# set here if the guard ran out first (the host took longer, or fn waited for the GPU itself).
_HOLD_SOURCE = r"""
extern "C" __global__ void ckptlab_hold_stream(unsigned long long flag_addr,
                                               unsigned long long guard_ns) {
    volatile int* flag = (volatile int*)flag_addr;  // mapped pinned host memory
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        if (flag[0] != 0) return;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < guard_ns);
    flag[1] = 1;
    __threadfence_system();
}
"""
HOLD_GUARD_S = 0.1  # the longest the stream is held: a fn that waits for the GPU costs this


class _StreamHold:
    """The host side of ckptlab_hold_stream: a 2-int flag in mapped pinned memory."""

    def __init__(self, cp):
        import ctypes

        rt = cp.cuda.runtime
        self.rt, self.ptr = rt, rt.hostAlloc(8, rt.hostAllocMapped | rt.hostAllocPortable)
        self.flag = (ctypes.c_int32 * 2).from_address(self.ptr)
        self.kernel = cp.RawKernel(_HOLD_SOURCE, "ckptlab_hold_stream")
        self.guard_ns = np.uint64(int(HOLD_GUARD_S * 1e9))

    def hold(self) -> None:
        """Queue the kernel: the stream waits until release() (or the guard)."""
        self.flag[0] = self.flag[1] = 0
        self.kernel((1,), (1,), (np.uint64(self.ptr), self.guard_ns))

    def release(self) -> None:
        self.flag[0] = 1

    def guard_hit(self) -> bool:
        """After the stream synchronised: did the guard release it, not the host?"""
        return bool(self.flag[1])

    def free(self) -> None:
        self.rt.freeHost(self.ptr)


def _time_cuda(fn, repeats: int, warmup: int, flush_l2: bool, hold_stream: bool = True,
               cp=None):
    """CUDA-event timing. Events are recorded on the current stream, so each one marks the
    point where the work queued before it has finished, whatever the host is doing. Per repeat:
    flush the L2, hold the stream, record start, call fn (it only queues work), record end,
    release the stream, wait for end. `cp` is CuPy (a stand-in in the CPU tests)."""
    cp = cp or device.xp("cuda")
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    l2_bytes = int(props["l2CacheSize"])
    flush = cp.empty(max(2 * l2_bytes, 1 << 20), dtype=cp.uint8) if flush_l2 else None  # (2*L2,)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    stream = _StreamHold(cp) if hold_stream else None
    blind = False
    try:
        if stream is not None:
            stream.hold()  # compiles the hold kernel before anything is timed
            stream.release()
        for _ in range(warmup):
            fn()
        dev.synchronize()
        if stream is not None and stream.guard_hit():  # released at once, yet the guard fired:
            blind = True  # the GPU does not see the host's write; time host-driven instead
            stream.free()
            stream = None
        samples, guarded = [], 0
        for _ in range(repeats):
            if flush is not None:
                flush.fill(0)  # writing 2x L2 evicts whatever fn's last call left in it
            if stream is not None:
                stream.hold()
            start.record()
            fn()
            end.record()
            if stream is not None:
                stream.release()
            end.synchronize()
            guarded += stream is not None and stream.guard_hit()
            samples.append(cp.cuda.get_elapsed_time(start, end) / 1e3)  # ms -> s
    finally:
        if stream is not None:
            stream.release()  # fn raised while the stream was held: let it go before waiting
        dev.synchronize()
        if stream is not None:
            stream.free()
    how = ("CUDA events, stream held until fn was queued (host time excluded)" if stream
           else "CUDA events, host-driven (host time between launches included)")
    if blind:
        how += ("; the stream hold was unavailable: the GPU did not see the host's release in "
                "mapped pinned memory")
    if guarded:
        how += (f" except in {guarded} repeat(s) where fn waited for the GPU or queued for over "
                f"{HOLD_GUARD_S * 1e3:.0f} ms: those include host time")
    if flush is not None:
        how += f", L2 flushed before each (write of {flush.nbytes / 1e6:.1f} MB)"
    return samples, f"cuda: {name}", how


# ----------------------------------------------------------------------------- peak memory


def peak_memory(fn, *, target=None) -> int:
    """Peak bytes allocated while `fn()` runs, above what was allocated before it.

    On "cuda": the CuPy memory pool's used bytes (what arrays hold, rounded to the pool's
    512-byte chunks), followed through CuPy's memory hooks, which the default pool calls on
    every malloc and free. On the CPU: tracemalloc, which sees NumPy's array buffers and Python
    objects but not memory a C extension mallocs itself (if tracemalloc was already tracing,
    its peak is reset here)."""
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
    if (target or device.target()) == "cuda":
        return _peak_cupy(fn, device.xp("cuda"))
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    before, _ = tracemalloc.get_traced_memory()
    try:
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return max(0, peak - before)


def _peak_cupy(fn, cp) -> int:
    """Follow the default pool's used bytes through malloc/free hooks; return the peak rise."""
    pool = cp.get_default_memory_pool()
    if getattr(cp.cuda.get_allocator(), "__self__", None) is not pool:
        raise RuntimeError("peak_memory: CuPy's allocator is not its default memory pool")
    used = peak = 0

    class PeakHook(cp.cuda.MemoryHook):  # CuPy's hook API is a subclass with these callbacks
        name = "ckptlab_peak_memory"

        def malloc_postprocess(self, **kw):
            nonlocal used, peak
            if kw["mem_ptr"]:  # 0 when the allocation failed
                used += kw["mem_size"]
                peak = max(peak, used)

        def free_postprocess(self, **kw):
            nonlocal used
            used -= kw["mem_size"]

    cp.cuda.Device().synchronize()
    before = pool.used_bytes()
    with PeakHook():
        fn()
        cp.cuda.Device().synchronize()
    if pool.used_bytes() - before != used:  # the hooks saw every malloc and free, or say so
        raise RuntimeError(
            f"peak_memory: the pool's used bytes changed by {pool.used_bytes() - before}, the "
            f"hooks counted {used}: another thread allocated, so the peak is not fn's alone"
        )
    return peak
