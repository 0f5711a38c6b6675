"""The instruments: CPU timer, tracemalloc peak, ncu CSV parsing (on sample text written out
in the layouts ncu prints), and, under `-m gpu`, the CUDA-event timer, the CuPy pool peak and
a measured copy under ncu."""

import importlib.util
import re
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ckptlab import device, measure
from ckptlab.measure import ncu, timing

gpu = pytest.mark.skipif(not device.cuda_available(), reason="no CUDA device visible to CuPy")
_spec = importlib.util.spec_from_file_location(  # bench/ is not a package
    "gpu_ncu", Path(__file__).resolve().parent.parent / "bench" / "gpu_ncu.py")
gpu_ncu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_ncu)

# ------------------------------------------------------------------------------------ timers


def test_time_fn_counts_warmup_and_repeats():
    calls = []
    t = measure.time_fn(lambda: calls.append(1), repeats=5, warmup=3, target="emu")
    assert len(calls) == 8 and len(t.samples_s) == 5
    assert t.p10_s <= t.median_s <= t.p90_s
    assert t.spread == pytest.approx((t.p90_s - t.p10_s) / t.median_s)
    assert t.device.startswith("cpu (") and "perf_counter" in t.method and "median of 5" in t.method


def test_time_fn_excludes_the_warmup_call():
    # The first call stands for compilation: 50 ms. None of the timed calls may see it.
    state = {"first": True}

    def fn():
        if state["first"]:
            state["first"] = False
            time.sleep(0.05)

    t = measure.time_fn(fn, repeats=5, warmup=1, target="emu")
    assert max(t.samples_s) < 0.05


def test_time_fn_measures_at_least_the_work():
    # time.sleep(s) sleeps at least s (Python >= 3.5), so every sample is >= 2 ms.
    t = measure.time_fn(lambda: time.sleep(0.002), repeats=3, warmup=0, target="emu")
    assert min(t.samples_s) >= 0.002


def test_time_fn_refuses_bad_arguments():
    with pytest.raises(TypeError, match="fn"):
        measure.time_fn(3)
    with pytest.raises(ValueError, match="repeats"):
        measure.time_fn(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="warmup"):
        measure.time_fn(lambda: None, warmup=-1)


# ------------------------------------------------------------------------------ peak memory


def test_peak_memory_sees_a_temporary_numpy_buffer():
    held_before = np.ones(5_000_000)  # 40 MB held before fn: not part of fn's peak

    def fn():
        a = np.ones(1_000_000)  # 8 MB, freed before the next one
        del a
        return np.ones(250_000)  # 2 MB

    peak = measure.peak_memory(fn, target="emu")
    # The peak is the 8 MB temporary plus a few small Python objects (array headers, frames):
    # well under 64 KiB of them.
    assert 8_000_000 <= peak < 8_000_000 + 64 * 1024
    assert held_before.nbytes == 40_000_000


class _FakePool:
    """Stands in for CuPy's MemoryPool and its hook calls, to check the accounting in
    _peak_cupy on a machine without a GPU (the real thing runs in test_peak_memory_cuda)."""

    def __init__(self, used):
        self.used, self.hooks = used, []

    def malloc(self, n):
        self.used += n
        for h in self.hooks:
            h.malloc_postprocess(device_id=0, size=n, mem_size=n, mem_ptr=1, pmem_id=1)

    def free(self, n):
        self.used -= n
        for h in self.hooks:
            h.free_postprocess(device_id=0, mem_size=n, mem_ptr=1, pmem_id=1)

    def used_bytes(self):
        return self.used


def _fake_cupy(pool):
    class MemoryHook:
        def __enter__(self):
            pool.hooks.append(self)
            return self

        def __exit__(self, *exc):
            pool.hooks.remove(self)

    cuda = SimpleNamespace(
        MemoryHook=MemoryHook,
        get_allocator=lambda: pool.malloc,
        Device=lambda: SimpleNamespace(synchronize=lambda: None),
    )
    return SimpleNamespace(cuda=cuda, get_default_memory_pool=lambda: pool)


def test_cupy_peak_accounting_with_a_stand_in_pool():
    pool = _FakePool(used=700)  # held before fn: not counted

    def fn():
        pool.malloc(1000)
        pool.malloc(3000)  # peak: 4000 above the start
        pool.free(1000)
        pool.malloc(500)

    assert timing._peak_cupy(fn, _fake_cupy(pool)) == 4000

    def sneaky():  # an allocation the hooks never saw, as from another thread
        pool.used += 512

    with pytest.raises(RuntimeError, match="another thread"):
        timing._peak_cupy(sneaky, _fake_cupy(pool))


@gpu
@pytest.mark.gpu
def test_peak_memory_cuda():
    cp = device.xp("cuda")

    def fn():
        a = cp.empty(1 << 20, dtype=cp.uint8)  # 1 MiB: a multiple of the pool's 512-byte unit
        del a
        b = cp.empty(3 << 20, dtype=cp.uint8)  # 3 MiB
        del b

    assert measure.peak_memory(fn, target="cuda") == 3 << 20


@gpu
@pytest.mark.gpu
def test_time_fn_cuda_events():
    cp = device.xp("cuda")
    x = cp.ones(1 << 24, dtype=cp.float32)  # 64 MiB
    t = measure.time_fn(lambda: x * 2, repeats=20, warmup=2, target="cuda")
    assert t.device.startswith("cuda: ") and "CUDA events" in t.method and "L2 flushed" in t.method
    # Reading 64 MiB and writing 64 MiB takes more than 10 us on any GPU (13 TB/s would be needed).
    assert len(t.samples_s) == 20 and t.median_s > 1e-5


# ------------------------------------------------------------------------------- ncu parsing

# ncu 2025.x, default (details) page, --csv --print-units base, with the program's own output
# and ncu's notices interleaved, as they come out of one process.
NCU_BASE_UNITS = """\
==PROF== Connected to process 48211 (/usr/bin/python3.12)
==PROF== Profiling "attn_flash_fwd" - 0: 0%....50%....100% - 1 pass
==PROF== Profiling "attn_flash_bwd_dkdv" - 1: 0%....50%....100% - 1 pass
"hello", from the program
tour: N=1024 done
==PROF== Disconnected from process 48211
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","48211","python3.12","127.0.0.1","attn_flash_fwd","1","7","(128, 1, 1)","(16, 16, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","2,101,248"
"0","48211","python3.12","127.0.0.1","attn_flash_fwd","1","7","(128, 1, 1)","(16, 16, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","1064960"
"1","48211","python3.12","127.0.0.1","attn_flash_bwd_dkdv","1","7","(128, 1, 1)","(16, 16, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","4,202,496"
"1","48211","python3.12","127.0.0.1","attn_flash_bwd_dkdv","1","7","(128, 1, 1)","(16, 16, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","2,129,920"
"""  # noqa: E501

# An older ncu (2021.x: a "Kernel Time" column, no Block/Grid Size) with its default automatic
# units: Mbyte, Kbyte, Gbyte are decimal (SI) prefixes.
NCU_AUTO_UNITS = """\
"ID","Process ID","Process Name","Host Name","Kernel Name","Kernel Time","Context","Stream","Section Name","Metric Name","Metric Unit","Metric Value"
"0","9120","python3.8","127.0.0.1","attn_naive_fwd","2021-Jun-03 10:11:12","1","7","Command line profiler metrics","dram__bytes_read.sum","Mbyte","33.55"
"0","9120","python3.8","127.0.0.1","attn_naive_fwd","2021-Jun-03 10:11:12","1","7","Command line profiler metrics","dram__bytes_write.sum","Kbyte","524.29"
"1","9120","python3.8","127.0.0.1","attn_naive_bwd","2021-Jun-03 10:11:12","1","7","Command line profiler metrics","dram__bytes_read.sum","Gbyte","1.07"
"1","9120","python3.8","127.0.0.1","attn_naive_bwd","2021-Jun-03 10:11:12","1","7","Command line profiler metrics","dram__bytes_write.sum","byte","512"
"""  # noqa: E501

# --page raw: one row per launch, one column per metric, the units in the row under the header.
NCU_RAW_PAGE = """\
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","dram__bytes_read.sum","dram__bytes_write.sum"
"","","","","","","","","","","","byte","byte"
"0","48211","python3.12","127.0.0.1","attn_flash_fwd","1","7","(128, 1, 1)","(16, 16, 1)","0","9.0","2101248","1064960"
"1","48211","python3.12","127.0.0.1","attn_flash_bwd_dkdv","1","7","(128, 1, 1)","(16, 16, 1)","0","9.0","4202496","2129920"
"""  # noqa: E501


def test_parse_base_units_skips_notices_and_program_output():
    rows = measure.parse_ncu_csv(NCU_BASE_UNITS)
    assert [(r["kernel"], r["launch_id"]) for r in rows] == [
        ("attn_flash_fwd", 0),
        ("attn_flash_bwd_dkdv", 1),
    ]
    assert rows[0]["bytes_read"] == 2_101_248 and rows[0]["bytes_written"] == 1_064_960
    assert rows[1]["bytes_total"] == 4_202_496 + 2_129_920
    assert all(r["source"] == "measured" for r in rows)


def test_parse_auto_units_converts_si_prefixes():
    rows = measure.parse_ncu_csv(NCU_AUTO_UNITS)
    assert rows[0]["kernel"] == "attn_naive_fwd"
    assert rows[0]["bytes_read"] == pytest.approx(33.55e6)
    assert rows[0]["bytes_written"] == pytest.approx(524.29e3)
    assert rows[1]["bytes_read"] == pytest.approx(1.07e9)
    assert rows[1]["bytes_written"] == 512


def test_parse_raw_page_matches_the_details_page():
    raw = measure.parse_ncu_csv(NCU_RAW_PAGE)
    assert raw == measure.parse_ncu_csv(NCU_BASE_UNITS)


def test_parse_decimal_comma_locale():
    text = NCU_AUTO_UNITS.replace('"33.55"', '"33,55"')
    assert measure.parse_ncu_csv(text)[0]["bytes_read"] == pytest.approx(33.55e6)


def test_parse_explains_an_empty_profile():
    text = (
        "==PROF== Connected to process 1 (/usr/bin/python3.12)\n"
        "==WARNING== No kernels were profiled.\n"
        "==PROF== Disconnected from process 1\n"
    )
    with pytest.raises(ValueError, match="No kernels were profiled"):
        measure.parse_ncu_csv(text)
    denied = "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU"
    with pytest.raises(ValueError, match="ERR_NVGPUCTRPERM"):
        measure.parse_ncu_csv(denied + " Performance Counters on the target device 0.\n")


def test_parse_refuses_unknown_units_and_missing_metrics():
    with pytest.raises(ValueError, match="unknown unit 'sector'"):
        measure.parse_ncu_csv(NCU_AUTO_UNITS.replace('"Kbyte"', '"sector"'))
    only_reads = "\n".join(ln for ln in NCU_BASE_UNITS.splitlines() if "write" not in ln)
    with pytest.raises(ValueError, match="lacks"):
        measure.parse_ncu_csv(only_reads)


def test_ncu_command_filters_kernels_and_asks_for_bytes():
    argv = measure.ncu_command("import ckptlab", kernel_regex="attn_flash")
    assert argv[0] == "ncu" and argv[-2:] == ["-c", "import ckptlab"]
    assert "dram__bytes_read.sum,dram__bytes_write.sum" in argv and "--csv" in argv
    assert argv[argv.index("--kernel-name") + 1] == "regex:attn_flash"
    assert argv[argv.index("--print-units") + 1] == "base"
    with pytest.raises(ValueError, match="python_code"):
        measure.ncu_command("  ")


def test_measure_hbm_bytes_says_when_ncu_is_missing(monkeypatch):
    monkeypatch.setattr(ncu.shutil, "which", lambda name: None)
    assert measure.ncu_available() is False
    with pytest.raises(RuntimeError, match="not on the PATH"):
        measure.measure_hbm_bytes("pass")


def test_sources_are_checked():
    assert measure.check_source("counted") == "counted"
    with pytest.raises(ValueError, match="source"):
        measure.check_source("estimated")


# A copy ncu can see: a named elementwise kernel. cp.copyto between contiguous arrays of one
# dtype is a cudaMemcpyAsync, which ncu does not profile (kernels only), and cp.ones runs
# CuPy's own cupy_fill, which COPY_KERNEL's regex must not match.
COPY_KERNEL = "ckptlab_copy_f32"
COPY_512MIB = f"""
import cupy as cp
copy = cp.ElementwiseKernel("float32 x", "float32 y", "y = x", {COPY_KERNEL!r})
x = cp.ones(1 << 27, dtype=cp.float32)  # 512 MiB, several times any GPU's L2 (cupy_fill)
y = cp.empty_like(x)
copy(x, y)
cp.cuda.Device().synchronize()
"""
COPY_REGEX = COPY_KERNEL  # ncu matches it against the function name (--kernel-name-base)


def test_the_copy_workload_launches_one_kernel_the_regex_picks():
    """COPY_512MIB against a stand-in CuPy that lists what would run on the GPU: the regex
    handed to ncu matches the copy kernel, once, with 2^27 floats in and out, and nothing else
    (not cupy_fill, not a memcpy, which ncu would not profile anyway)."""
    ran = []

    def kernel(in_params, out_params, operation, name):
        def launch(x, y):
            assert y.size == x.size
            ran.append(("kernel", name, x.size))

        return launch

    def ones(n, dtype):
        ran.append(("kernel", "cupy_fill", n))
        return SimpleNamespace(size=n)

    cp = SimpleNamespace(
        float32=np.float32, ElementwiseKernel=kernel, ones=ones,
        empty_like=lambda a: SimpleNamespace(size=a.size),
        copyto=lambda dst, src: ran.append(("memcpy", None, src.size)),
        cuda=SimpleNamespace(Device=lambda: SimpleNamespace(synchronize=lambda: None)),
    )
    code = COPY_512MIB.replace("import cupy as cp\n", "")
    exec(code, {"cp": cp})  # our own constant, on the stand-in
    picked = [r for r in ran if r[0] == "kernel" and re.search(COPY_REGEX, r[1])]
    assert picked == [("kernel", COPY_KERNEL, 1 << 27)], ran
    assert not re.search(COPY_REGEX, "cupy_fill") and not re.search(COPY_REGEX, "cupy_copy")


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(not measure.ncu_available(), reason="ncu (Nsight Compute) is not on the PATH")
def test_measured_bytes_of_a_copy():
    try:
        rows = measure.measure_hbm_bytes(COPY_512MIB, kernel_regex=COPY_REGEX)
    except (RuntimeError, ValueError) as e:  # a machine whose counters ncu cannot read (gVisor)
        reason = gpu_ncu.counters_unavailable(str(e))
        if reason:
            pytest.skip(f"ncu cannot read the GPU's performance counters here: {reason}")
        raise
    size = 1 << 29
    assert [r["kernel"] for r in rows] == [COPY_KERNEL], rows
    # The copy reads 512 MiB and writes 512 MiB. At most one L2's worth (<= 72 MiB on the parts
    # in roofline.SPECS) can be served from, or left dirty in, the L2 instead of DRAM: 15%.
    assert 0.85 * size <= rows[0]["bytes_read"] <= 1.05 * size
    assert 0.85 * size <= rows[0]["bytes_written"] <= 1.05 * size


@pytest.mark.parametrize("message, skips", [
    ("ncu exited with 1:\n==ERROR== Failed to initialize the profiler: LibraryNotLoaded", True),
    ("parse_ncu_csv: no ncu CSV table found; ncu said: ==ERROR== ERR_NVGPUCTRPERM - The user "
     "does not have permission to access NVIDIA GPU Performance Counters", True),
    ("ncu exited with 9:\nSegmentation fault", False),
])
def test_the_copy_measurement_skips_only_where_counters_are_unreadable(monkeypatch, message,
                                                                       skips):
    def refuse(*args, **kw):
        raise RuntimeError(message)

    monkeypatch.setattr(measure, "measure_hbm_bytes", refuse)
    if skips:
        with pytest.raises(pytest.skip.Exception, match="cannot read the GPU's performance"):
            test_measured_bytes_of_a_copy()  # the GPU test's body, its marks bypassed
    else:
        with pytest.raises(RuntimeError, match="Segmentation fault"):
            test_measured_bytes_of_a_copy()
