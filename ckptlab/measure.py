"""The instruments: wall time, peak memory, and HBM bytes measured by Nsight Compute.

- time_fn: CUDA events on the "cuda" target (warm-up calls excluded, so compilation is too; L2
  flushed before each repeat), time.perf_counter on the CPU; median and spread of the repeats.
- peak_memory: the most bytes held at once while fn runs, over what was held before it: the CuPy
  memory pool's used bytes on a GPU, tracemalloc (which sees NumPy's buffers) on the CPU.
- ncu_command / measure_hbm_bytes / parse_ncu_csv: run a workload under `ncu` and read
  dram__bytes_read.sum and dram__bytes_write.sum per kernel launch.

Every HBM byte figure in ckptlab carries its source: "counted" (the emulator's exact count of
global-memory requests), "measured" (Nsight Compute's DRAM counters) or "modeled" (the formula in
ckptlab.traffic). The three answer different questions and must never be mixed unlabelled.
"""

from __future__ import annotations

import csv
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ckptlab import device

SOURCES = ("counted", "measured", "modeled")
NCU_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
REPO_ROOT = Path(__file__).resolve().parent.parent


def check_source(source: str) -> str:
    """Refuse a byte figure whose source is not one of SOURCES."""
    if source not in SOURCES:
        raise ValueError(f"source: expected one of {SOURCES}, got {source!r}")
    return source


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


def _cpu_label() -> str:
    return f"cpu ({platform.machine() or 'unknown'}, {os.cpu_count()} cores)"


def time_fn(fn, *, repeats: int = 20, warmup: int = 2, flush_l2: bool = True, target=None):
    """Time `fn()` `repeats` times after `warmup` untimed calls (run-time compilation and first
    touches happen there). On "cuda": CUDA events around each call, with a write of twice the L2
    size before each so every repeat starts with a cold cache. On the CPU: perf_counter; the
    CPU caches are not flushed (flush_l2 applies to the GPU's L2 only)."""
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats: expected an int >= 1, got {repeats!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup: expected an int >= 0, got {warmup!r}")
    if (target or device.target()) == "cuda":
        samples, label, how = _time_cuda(fn, repeats, warmup, flush_l2)
    else:
        for _ in range(warmup):
            fn()
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        label, how = _cpu_label(), "time.perf_counter"
    s = np.asarray(samples, dtype=np.float64)
    median, p10, p90 = (float(v) for v in np.percentile(s, [50, 10, 90]))
    method = f"{how}, median of {repeats} after {warmup} warm-up call(s)"
    spread = (p90 - p10) / median if median > 0 else float("nan")
    return Timing(median, p10, p90, spread, tuple(float(v) for v in s), label, method)


def _time_cuda(fn, repeats: int, warmup: int, flush_l2: bool):
    """CUDA-event timing. Events are recorded on the current stream, so each one marks the
    point where the work queued before it has finished, whatever the host is doing."""
    cp = device.xp("cuda")
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    l2_bytes = int(props["l2CacheSize"])
    flush = cp.empty(max(2 * l2_bytes, 1 << 20), dtype=cp.uint8) if flush_l2 else None  # (2*L2,)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(warmup):
        fn()
    dev.synchronize()
    samples = []
    for _ in range(repeats):
        if flush is not None:
            flush.fill(0)  # writing 2x L2 evicts whatever fn's last call left in it
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(cp.cuda.get_elapsed_time(start, end) / 1e3)  # ms -> s
    how = "CUDA events"
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


# ----------------------------------------------------------------------------- Nsight Compute


def ncu_available() -> bool:
    """True when Nsight Compute's `ncu` is on the PATH."""
    return shutil.which("ncu") is not None


def ncu_command(python_code: str, *, kernel_regex: str = "attn_", python: str | None = None):
    """The argv that profiles `python -c python_code` under ncu: only kernels whose name
    matches `kernel_regex`, the two DRAM byte counters, CSV, units in plain bytes
    (--print-units base), and the clocks left as found (--clock-control none)."""
    if not isinstance(python_code, str) or not python_code.strip():
        raise ValueError(f"python_code: expected a non-empty string, got {python_code!r}")
    if not isinstance(kernel_regex, str) or not kernel_regex:
        raise ValueError(f"kernel_regex: expected a non-empty regex string, got {kernel_regex!r}")
    return [
        "ncu",
        "--metrics", ",".join(NCU_METRICS),
        "--csv",
        "--print-units", "base",
        "--clock-control", "none",
        "--kernel-name", f"regex:{kernel_regex}",
        python or sys.executable, "-c", python_code,
    ]


def measure_hbm_bytes(python_code: str, *, kernel_regex: str = "attn_", timeout_s: float = 600):
    """Run `python_code` in a subprocess under ncu and return parse_ncu_csv of what it printed:
    one row per profiled kernel launch, source "measured". The repository root is put on
    PYTHONPATH so the code can import ckptlab."""
    if not ncu_available():
        raise RuntimeError("measure_hbm_bytes: `ncu` (Nsight Compute) is not on the PATH")
    argv = ncu_command(python_code, kernel_regex=kernel_regex)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-8:]
        raise RuntimeError(f"ncu exited with {proc.returncode}:\n" + "\n".join(tail))
    return parse_ncu_csv(proc.stdout + "\n" + proc.stderr)


# ncu prints bytes with SI prefixes unless told --print-units base; binary ones accepted too.
_BYTE_UNITS = {
    "byte": 1, "bytes": 1, "b": 1,
    "kbyte": 1e3, "kb": 1e3, "mbyte": 1e6, "mb": 1e6,
    "gbyte": 1e9, "gb": 1e9, "tbyte": 1e12, "tb": 1e12,
    "kibyte": 1024, "kib": 1024, "mibyte": 1024**2, "mib": 1024**2,
    "gibyte": 1024**3, "gib": 1024**3,
}
_THOUSANDS = re.compile(r"^\d{1,3}(,\d{3})+(\.\d+)?$")  # 1,048,576 or 1,048,576.5
_DECIMAL_COMMA = re.compile(r"^\d+,\d+$")  # 33,55 (a comma-decimal locale)


def _number(text: str) -> float:
    """A value as ncu prints it: 1048576, 1,048,576 (thousands separators, as ncu writes them
    in English locales), 33.55, or 33,55 (a comma-decimal locale, when not three digits)."""
    t = text.strip()
    if _THOUSANDS.match(t):
        t = t.replace(",", "")
    elif _DECIMAL_COMMA.match(t):
        t = t.replace(",", ".")
    try:
        return float(t)
    except ValueError:
        raise ValueError(f"ncu value: expected a number, got {text!r}") from None


def _to_bytes(value: str, unit: str, metric: str) -> float:
    scale = _BYTE_UNITS.get(unit.strip().lower())
    if scale is None:
        raise ValueError(f"{metric}: unknown unit {unit!r}; expected one of {sorted(_BYTE_UNITS)}")
    return _number(value) * scale


def _find_header(lines: list[str]) -> tuple[int, list[str]]:
    """Index and fields of the table's header line; a clear error (with ncu's own ==ERROR== and
    ==WARNING== lines) when there is none, e.g. no kernel matched or counters were denied."""
    for i, line in enumerate(lines):
        fields = next(csv.reader([line])) if line.startswith('"') else []
        if "Kernel Name" in fields and ("Metric Name" in fields or NCU_METRICS[0] in fields):
            return i, fields
    notes = [ln.strip() for ln in lines if ln.startswith(("==ERROR==", "==WARNING=="))]
    raise ValueError(
        "parse_ncu_csv: no ncu CSV table found (expected a header with 'Kernel Name')"
        + ("; ncu said: " + " | ".join(notes) if notes else "")
    )


def parse_ncu_csv(text: str) -> list[dict]:
    """Per kernel launch, bytes read from and written to DRAM, from `ncu --csv` output.

    Reads both layouts ncu prints: the default (one row per metric: ..."Kernel Name",...,
    "Metric Name","Metric Unit","Metric Value") and --page raw (one row per launch, a column per
    metric, units in the row under the header). Lines that are not part of the table (==PROF==
    notices, the program's own output) are skipped. Returns dicts with kernel, launch_id,
    bytes_read, bytes_written, bytes_total and source="measured", ordered by launch id."""
    if not isinstance(text, str):
        raise TypeError(f"text: expected the str ncu printed, got {type(text).__name__}")
    lines = text.splitlines()
    start, header = _find_header(lines)
    rows = [r for r in csv.reader(lines[start + 1 :]) if len(r) == len(header)]
    col = {name: k for k, name in enumerate(header)}
    launches: dict = {}  # launch id -> {"kernel": ..., metric: bytes}
    if "Metric Name" in col:
        for r in rows:
            metric = r[col["Metric Name"]]
            if metric in NCU_METRICS:
                launch = launches.setdefault(r[col["ID"]], {"kernel": r[col["Kernel Name"]]})
                launch[metric] = _to_bytes(r[col["Metric Value"]], r[col["Metric Unit"]], metric)
    elif rows:
        units, data = rows[0], rows[1:]  # --page raw: the row under the header holds the units
        for r in data:
            launch = launches.setdefault(r[col["ID"]], {"kernel": r[col["Kernel Name"]]})
            for metric in NCU_METRICS:
                if metric in col:
                    launch[metric] = _to_bytes(r[col[metric]], units[col[metric]], metric)
    out = []
    for launch_id, m in launches.items():
        missing = [name for name in NCU_METRICS if name not in m]
        if missing:
            raise ValueError(f"parse_ncu_csv: launch {launch_id} ({m['kernel']}) lacks {missing}")
        read, written = m[NCU_METRICS[0]], m[NCU_METRICS[1]]
        out.append({
            "kernel": m["kernel"], "launch_id": int(_number(launch_id)),
            "bytes_read": read, "bytes_written": written, "bytes_total": read + written,
            "source": "measured",
        })
    return sorted(out, key=lambda d: d["launch_id"])
