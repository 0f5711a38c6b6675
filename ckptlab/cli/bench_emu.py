"""How fast is the CPU emulator? `python -m ckptlab bench emu`

Runs kernels/sgemm_tiled.cu at M = N = K = 256 (65,536 emulated threads, 16 k-tiles, 32
__syncthreads each) in each mode, on one worker and on several (OS threads running blocks at
once), and reports the median over repeats:

    threads/s  = emulated CUDA threads / wall seconds of the launch (compile excluded)
    vs fast    = median time of the mode / median time of "fast" on as many workers
    speed-up   = median time on 1 worker / median time on this many workers, same mode

Modes: "fast" (plain build), "counted" (memory hooks: bytes per argument, bounds), and
"counted+race" (also the race check, the default in tests). Timings on a shared machine vary:
the load average (/proc/loadavg) is printed with them; compare runs made under the same load.

The native anchor: ckptlab/emu/native_sgemm.cpp, the same tiled loop nest as a CPU compiler
would run it once the block's threads are loops between barriers (CuPBoP / COX), compiled with
the system's g++ -O2 and timed on one core in the same run, interleaved with the emulator's
launches; its C must equal the emulator's bit for bit (same operations, same order).
The second anchor, sgemm_one_thread_at_a_time in the same file, runs the same regions one
thread at a time (each thread's part of a region whole, a call the compiler cannot see through
between threads): the order the emulator's fibers run them in, with switches that cost
nothing, so the floor of any emulator that runs a thread at a time; the gap from it to the
first is what threads' overlapping arithmetic buys, the gap above it the emulator's own cost
(its C is checked bitwise too):

    cpu ms     = median CPU time of the launching thread (one worker: it runs the blocks
                 itself), which other processes' load inflates far less than wall time
    vs native  = median CPU time of the row / that of the first native loop nest (one
                 worker; several: wall time / its wall time)

The flash pair (kernels/attn_flash_fwd.cu then _bwd.cu, forward + backward, B = H = 1,
N = 1024, d = 64, one worker) is timed per mode too: wall and CPU time of the two calls.

A further table runs the same product on tensor cores, kernels/wmma_gemm.cu<__nv_bfloat16>
(the same 16 x 16 tiles, one warp a tile: 8,192 threads), next to the fp32 SGEMM, per mode:

    MFLOP/s    = 2 M N K / wall seconds of the launch (emulated FLOPs per second of CPU time)
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ckptlab import device, emu
from ckptlab.cli.report import (
    UsageError,
    check_bytes,
    check_fits,
    nonnegative_int,
    positive_int,
    writable_file,
    write_csv,
)
from ckptlab.emu.build import compiler, compiler_version
from ckptlab.emu.cache import locked_build
from ckptlab.kernels.table import SGEMM_TILE as TILE
from ckptlab.kernels.table import WMMA_TILE

MODES = (("fast", False), ("counted", False), ("counted+race", True))
# One launch on one worker, as docs/emulator.md measured it ("Measured speed (2 cores)",
# 2026-12-01): SGEMM 256^3, median ms per mode; the flash pair (N = 1024, d = 64), median ms.
SGEMM_256_MS = {"fast": 47.6, "counted": 130.0, "counted+race": 308.8}
FLASH_1024_MS = {"fast": 311, "counted": 2297}
MAX_HOURS = 1  # a run that would take longer there is refused before it starts
NATIVE = Path(emu.__file__).resolve().parent / "native_sgemm.cpp"
NATIVE_FLAGS = ("-O2", "-fPIC", "-shared")


NATIVE_VARIANTS = {"native g++ -O2": "sgemm_loops",
                   "native, 1 thread at a time": "sgemm_one_thread_at_a_time"}


def native_sgemm(symbol: str = "sgemm_loops"):
    """A loop nest of native_sgemm.cpp (sgemm_loops, or sgemm_one_thread_at_a_time) built with
    g++ -O2 into the emulator's cache: a function (A, B, C) -> None for C-contiguous fp32
    matrices."""
    cxx = compiler()
    key = hashlib.sha256(b"\0".join([NATIVE.read_bytes(), compiler_version(cxx).encode(),
                                      *(f.encode() for f in NATIVE_FLAGS)])).hexdigest()[:24]

    def build(tmp: Path, out: Path):
        proc = subprocess.run([cxx, *NATIVE_FLAGS, "-o", str(out), str(NATIVE)],
                              capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"compiling {NATIVE.name} failed:\n{proc.stderr.strip()}")

    lib = ctypes.CDLL(str(locked_build(emu.cache_dir() / f"native_sgemm-{key}.so", build)))
    fn = getattr(lib, symbol)
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 3

    def sgemm(A, B, C):
        (M, K), N = A.shape, B.shape[1]
        fn(A.ctypes.data, B.ctypes.data, C.ctypes.data, M, N, K)
    return sgemm


def load_average() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


def seconds_at_least(size: int, repeats: int, flash_n: int, flash_repeats: int) -> float:
    """A lower bound on this benchmark's time at the speeds above: per mode, the SGEMM's
    warm-up and repeats (scaled by size^3) twice, for the tensor-core table runs it again (its
    other worker counts, the wmma kernel and the native loops left out), and the flash pair's
    warm-up and repeats (scaled by N^2)."""
    gemm = 2 * (1 + repeats) * sum(SGEMM_256_MS.values()) / 1e3 * (size / 256) ** 3
    flash = (1 + flash_repeats) * sum(FLASH_1024_MS.values()) / 1e3 * (flash_n / 1024) ** 2
    return gemm + (flash if flash_n else 0.0)


def check_sizes(size: int, repeats: int, flash_n: int, flash_repeats: int) -> None:
    """Before any work: the GEMM's and the flash pair's arrays must fit in the host's memory
    (TooBig), and the run must not take hours (UsageError, with the estimate)."""
    # A, B and C fp32 (size x size) for the SGEMM; the wmma run's bf16 A, B and fp32 C less
    check_bytes(3 * size * size * 4, f"the {size}^3 GEMM's three fp32 matrices", target="emu",
                hint="choose a smaller --size")
    if flash_n:
        check_fits("flash", 1, 1, flash_n, 64, target="emu")
    hours = seconds_at_least(size, repeats, flash_n, flash_repeats) / 3600
    if hours > MAX_HOURS:
        raise UsageError(f"bench emu at --size {size} --repeats {repeats} --flash-n {flash_n} "
                         f"--flash-repeats {flash_repeats} would take at least {hours:.3g} h at "
                         "the emulator speeds docs/emulator.md measured on 2 cores (SGEMM 256^3: "
                         "48-309 ms a launch; flash pair at N = 1024: 0.31-2.3 s): choose "
                         f"smaller sizes or fewer repeats (at most {MAX_HOURS} h)")


def run(size: int = 256, repeats: int = 5, workers=(1, None)) -> list[dict]:
    """Rows of {mode, workers, size, threads, median_s, min_s, max_s, threads_per_s, cpu_s,
    overhead, speedup, vs_native}, the two native loop nests' last. workers: the counts to run
    (None: one per CPU); cpu_s (CPU seconds of the calling thread) on one worker only."""
    counts = sorted({w or emu.config.cpus() for w in workers})
    with device.use("emu"):
        f = device.load("sgemm_tiled.cu").get_function("sgemm_tiled")
    rng = np.random.default_rng(0)
    A = rng.standard_normal((size, size), dtype=np.float32)
    B = rng.standard_normal((size, size), dtype=np.float32)
    C = np.empty((size, size), np.float32)
    grid, block = (-(-size // TILE), -(-size // TILE)), (TILE, TILE)
    args = (A, B, C, np.int32(size), np.int32(size), np.int32(size))
    threads = grid[0] * grid[1] * TILE * TILE
    natives = {label: native_sgemm(sym) for label, sym in NATIVE_VARIANTS.items()}
    native_times = {label: [] for label in natives}
    native_cpu = {label: [] for label in natives}
    C_native = np.empty_like(C)
    rows = []
    for label, race in MODES:
        mode = "fast" if label == "fast" else "counted"
        with emu.settings(mode=mode, race_check=race):
            f(grid, block, args)  # warm-up: builds this mode's library if needed
            for name, native in natives.items():
                C_native.fill(np.nan)
                native(A, B, C_native)
                if not np.array_equal(C.view(np.uint32), C_native.view(np.uint32)):
                    raise RuntimeError(f"{name}'s C differs from the emulator's ({label}): "
                                       f"{NATIVE.name} no longer matches the kernel")
            times = {w: [] for w in counts}
            cpu = {w: [] for w in counts}
            for _ in range(repeats):  # interleaved: a change in load hits every count alike
                for w in counts:
                    with emu.settings(workers=w):
                        c0 = time.thread_time()
                        times[w].append(f(grid, block, args).seconds)
                        cpu[w].append(time.thread_time() - c0)
                for name, native in natives.items():
                    c0, t0 = time.thread_time(), time.perf_counter()
                    native(A, B, C_native)
                    native_times[name].append(time.perf_counter() - t0)
                    native_cpu[name].append(time.thread_time() - c0)
        for w in counts:
            rows.append(_row(label, w, size, threads, times[w], cpu[w] if w == 1 else None))
    native_rows = [_row(name, 1, size, threads, native_times[name], native_cpu[name])
                   for name in natives]
    anchor = native_rows[0]
    for r in rows:
        fast = next(x for x in rows if x["mode"] == "fast" and x["workers"] == r["workers"])
        one = next(x for x in rows if x["mode"] == r["mode"] and x["workers"] == counts[0])
        r["overhead"] = r["median_s"] / fast["median_s"]
        r["speedup"] = one["median_s"] / r["median_s"]
        r["vs_native"] = (r["cpu_s"] / anchor["cpu_s"] if r["cpu_s"] is not None
                          else r["median_s"] / anchor["median_s"])
    fast = next(x for x in rows if x["mode"] == "fast" and x["workers"] == counts[0])
    for r in native_rows:
        r.update(overhead=r["median_s"] / fast["median_s"], speedup=1.0,
                 vs_native=r["cpu_s"] / anchor["cpu_s"])
    return rows + native_rows


def _row(label, w, size, threads, times, cpu=None) -> dict:
    med = statistics.median(times)
    return dict(mode=label, workers=w, size=size, threads=threads, median_s=med,
                min_s=min(times), max_s=max(times), threads_per_s=threads / med,
                cpu_s=statistics.median(cpu) if cpu else None)


FLASH_MODES = (("fast", False), ("counted", False))


def run_flash(n: int = 1024, d: int = 64, repeats: int = 3, modes=FLASH_MODES) -> list[dict]:
    """Rows of {kernel, mode, n, d, median_s, min_s, max_s, cpu_s}: the flash forward +
    backward (B = H = 1) on one worker, wall seconds of the two calls and the median CPU
    seconds of the calling thread (which runs the blocks), per mode."""
    from ckptlab.kernels import flash

    rng = np.random.default_rng(0)
    q, k, v, dO = (rng.standard_normal((1, 1, n, d)).astype(np.float32) for _ in range(4))
    rows = []
    with device.use("emu"):
        for label, race in modes:
            mode = "fast" if label == "fast" else "counted"
            with emu.settings(mode=mode, race_check=race, workers=1):
                times, cpu = [], []
                for i in range(repeats + 1):  # the first: a warm-up (builds if needed)
                    c0, t0 = time.thread_time(), time.perf_counter()
                    _, saved = flash.flash_forward(q, k, v)
                    flash.flash_backward(dO, q, k, v, saved)
                    if i:
                        times.append(time.perf_counter() - t0)
                        cpu.append(time.thread_time() - c0)
            rows.append(dict(kernel="flash fwd+bwd", mode=label, n=n, d=d,
                             median_s=statistics.median(times), min_s=min(times),
                             max_s=max(times), cpu_s=statistics.median(cpu)))
    return rows


def format_flash_rows(rows: list[dict]) -> str:
    r0 = rows[0]
    out = [f"flash forward + backward, N = {r0['n']}, d = {r0['d']}, B = H = 1, one worker, "
           "median of repeats (min..max)",
           f"{'mode':<14}{'median ms':>11}{'min..max ms':>18}{'cpu ms':>9}{'vs fast':>9}"]
    fast = next(r for r in rows if r["mode"] == "fast")
    for r in rows:
        spread = f"{r['min_s'] * 1e3:.0f}..{r['max_s'] * 1e3:.0f}"
        out.append(f"{r['mode']:<14}{r['median_s'] * 1e3:>11.0f}{spread:>18}"
                   f"{r['cpu_s'] * 1e3:>9.0f}{r['cpu_s'] / fast['cpu_s']:>8.2f}x")
    return "\n".join(out)


WMMA = "wmma_gemm<__nv_bfloat16>"


def run_wmma(size: int = 256, repeats: int = 5) -> list[dict]:
    """Rows of {kernel, mode, size, median_s, mflops_per_s} for the bf16 wmma GEMM and the fp32
    SGEMM on the same random inputs (rounded to bf16 for both), in each mode."""
    import ml_dtypes

    with device.use("emu"):
        kernels = {"sgemm_tiled (fp32)": device.load("sgemm_tiled.cu").get_function("sgemm_tiled"),
                   "wmma_gemm (bf16)": device.load("wmma_gemm.cu", name_expressions=(WMMA,))
                   .get_function(WMMA)}
    rng = np.random.default_rng(0)
    A16 = rng.standard_normal((size, size)).astype(ml_dtypes.bfloat16)
    B16 = rng.standard_normal((size, size)).astype(ml_dtypes.bfloat16)
    A, B = A16.astype(np.float32), B16.astype(np.float32)
    C = np.empty((size, size), np.float32)
    dims = (np.int32(size), np.int32(size), np.int32(size))
    launches = {
        "sgemm_tiled (fp32)": (((-(-size // TILE),) * 2), (TILE, TILE), (A, B, C, *dims)),
        "wmma_gemm (bf16)": (((-(-size // WMMA_TILE),) * 2), (32,), (A16, B16, C, *dims)),
    }
    rows = []
    for label, race in MODES:
        mode = "fast" if label == "fast" else "counted"
        for name, f in kernels.items():
            grid, block, args = launches[name]
            with emu.settings(mode=mode, race_check=race):
                f(grid, block, args)  # warm-up: builds this mode's library if needed
                times = [f(grid, block, args).seconds for _ in range(repeats)]
            med = statistics.median(times)
            rows.append(dict(kernel=name, mode=label, size=size, median_s=med, min_s=min(times),
                             max_s=max(times), mflops_per_s=2 * size**3 / med / 1e6))
    return rows


def format_wmma_rows(rows: list[dict]) -> str:
    out = [f"C = A B, {rows[0]['size']}^3, on the emulator: CUDA cores (fp32) vs tensor cores "
           "(bf16 wmma), median of repeats",
           f"{'kernel':<20}{'mode':<14}{'median ms':>11}{'min-max ms':>15}{'MFLOP/s':>10}"]
    for r in rows:
        spread = f"{r['min_s'] * 1e3:.1f}-{r['max_s'] * 1e3:.1f}"
        out.append(f"{r['kernel']:<20}{r['mode']:<14}{r['median_s'] * 1e3:>11.1f}{spread:>15}"
                   f"{r['mflops_per_s']:>10.1f}")
    return "\n".join(out)


def format_rows(rows: list[dict]) -> str:
    out = [f"SGEMM {rows[0]['size']}^3 on the emulator ({rows[0]['threads']:,} threads), "
           f"median of repeats (min..max), {os.cpu_count()} CPUs, load average "
           f"{load_average()}",
           f"{'mode':<27}{'workers':>8}{'median ms':>11}{'min..max ms':>16}{'M threads/s':>13}"
           f"{'vs fast':>9}{'speed-up':>10}{'cpu ms':>9}{'vs native':>11}"]
    for r in rows:
        spread = f"{r['min_s'] * 1e3:.1f}..{r['max_s'] * 1e3:.1f}"
        cpu = "-" if r["cpu_s"] is None else f"{r['cpu_s'] * 1e3:.1f}"
        out.append(f"{r['mode']:<27}{r['workers']:>8}{r['median_s'] * 1e3:>11.1f}{spread:>16}"
                   f"{r['threads_per_s'] / 1e6:>13.2f}{r['overhead']:>8.2f}x"
                   f"{r['speedup']:>9.2f}x{cpu:>9}{r['vs_native']:>10.1f}x")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ckptlab bench emu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=positive_int, default=256, help="M = N = K (default 256)")
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--workers", default=None,
                   help="comma-separated worker counts (default: 1 and one per CPU)")
    p.add_argument("--flash-n", type=nonnegative_int, default=1024,
                   help="N of the flash pair at d = 64 (default 1024; 0 skips it)")
    p.add_argument("--flash-repeats", type=positive_int, default=3)
    p.add_argument("--csv", metavar="FILE", help="also write the rows as CSV ('-': stdout)")
    a = p.parse_args(argv)
    if a.csv is not None:
        writable_file(a.csv)
    check_sizes(a.size, a.repeats, a.flash_n, a.flash_repeats)
    workers = (1, None)
    if a.workers:
        try:
            workers = tuple(int(w) for w in a.workers.split(","))
        except ValueError:
            p.error(f"--workers: comma-separated integers, got {a.workers!r}")
        if not all(1 <= w <= emu.abi.MAX_WORKERS for w in workers):
            p.error(f"--workers: each in [1, {emu.abi.MAX_WORKERS}]")
    rows = run(a.size, a.repeats, workers)
    print(format_rows(rows))
    flash_rows = []
    if a.flash_n:
        flash_rows = run_flash(a.flash_n, 64, a.flash_repeats)
        print()
        print(format_flash_rows(flash_rows))
    wmma_rows = run_wmma(a.size, a.repeats)
    print()
    print(format_wmma_rows(wmma_rows))
    if a.csv is not None:
        write_csv(rows + flash_rows + wmma_rows, a.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
