"""NVIDIA's real compiler as a check: every kernels/*.cu compiles for every arch of
ckptlab.kernels.archs (sm_75 T4 ... sm_90 H100; sm_80 and sm_90 in the default run, the others
with the slow tests) through NVRTC (and nvcc where it is installed), each arch with the
instantiations it supports and none it refuses, and ptxas' report is read right.

The kernel files are listed when pytest collects, so a new kernel is checked without editing
this file. NVRTC is in requirements-dev.txt, so a missing NVRTC fails (with the install line)
rather than skipping: a skip here would silently stop checking every kernel.
"""

import shutil
import textwrap

import pytest

from ckptlab.cli import kernels_report
from ckptlab.device import KERNELS_DIR
from ckptlab.kernels import archs, ptxas_log
from ckptlab.kernels import nvrtc as cc

# The tensor-core attention files instantiate 32 and 100 templates (two 16-bit types, eight tile
# head dims, both methods and dQ modes): about 25 s and 60 s per arch for NVRTC, so they run
# with the slow tests (CI runs those too). No *.cu at all: test_there_are_kernels fails.
KERNEL_FILES = [pytest.param(p, marks=pytest.mark.slow) if p.name.endswith("_tc.cu") else p
                for p in sorted(KERNELS_DIR.glob("*.cu"))]
HAS_NVCC = shutil.which("nvcc") is not None
needs_nvcc = pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not on the PATH (NVRTC still runs)")
BACKENDS = ["nvrtc", pytest.param("nvcc", marks=needs_nvcc)]
# The default run compiles each CUDA-core file once, with NVRTC (what pip installs everywhere)
# for sm_80; the other archs (sm_75, sm_86, sm_89: T4, RTX 30xx / A10, L4 / RTX 40xx; sm_90),
# and nvcc for every arch, run with the slow tests. Refusals per arch: tests/test_archs.py.
ARCH_PARAMS = [a if a == "sm_80" else pytest.param(a, marks=pytest.mark.slow) for a in cc.ARCHS]


def check_records(path, records, arch):
    """Sane records: every extern "C" kernel of the file and every template instantiation the
    wrappers launch from it that `arch` supports is there (so compiled by ptxas, not only
    parsed), none it refuses, with registers > 0 and every field a CUDA 12/13 ptxas prints
    filled in."""
    kernels = {r["kernel"]: r for r in records if r["kind"] == "kernel"}
    wanted = (set(ptxas_log.extern_c_kernels(path.read_text()))
              | set(archs.supported(path.name, arch)))
    missing = wanted - set(kernels)
    assert not missing, f"{path.name}: kernels missing from the {arch} report: {sorted(missing)}"
    refused = set(archs.refused(path.name, arch)) & set(kernels)
    assert not refused, f"{path.name}: {arch} compiled what it refuses: {sorted(refused)}"
    for r in kernels.values():
        assert r["arch"] == arch and r["file"] == path.name
        assert 0 < r["registers"] <= 255, r  # 255: the per-thread limit since sm_35
        assert r["barriers"] is not None and r["barriers"] >= 0, r
        assert r["smem"] >= 0 and r["stack"] >= 0, r
        assert r["spill_stores"] >= 0 and r["spill_loads"] >= 0, r
        assert r["compile_s"] > 0


def test_there_are_kernels():
    assert len(KERNEL_FILES) >= 4, f"no *.cu files in {KERNELS_DIR}"


@pytest.mark.parametrize("arch", ARCH_PARAMS)
@pytest.mark.parametrize("path", KERNEL_FILES, ids=lambda p: getattr(p, "name", "none"))
def test_kernel_file_compiles_nvrtc(path, arch):
    check_records(path, cc.compile_file(path, arch, "nvrtc"), arch)


@needs_nvcc
@pytest.mark.slow  # the same files through the other compiler: NVRTC checks them by default
@pytest.mark.parametrize("arch", cc.ARCHS)
@pytest.mark.parametrize("path", KERNEL_FILES, ids=lambda p: getattr(p, "name", "none"))
def test_kernel_file_compiles_nvcc(path, arch):
    check_records(path, cc.compile_file(path, arch, "nvcc"), arch)


# A tiny kernel whose costs are known: a 16 x 17 float tile is 1088 bytes of static shared
# memory, one __syncthreads is one barrier; a local header tests the -I to the file's folder.
TINY_HEADER = "#pragma once\n#define TILE 16\n"
TINY = """\
#include "tiny.cuh"
extern "C" __global__ void tile_transpose(const float* x, float* y, int n) {
    __shared__ float tile[TILE][TILE + 1];  // +1: no bank conflicts on the transposed read
    int r = blockIdx.y * TILE + threadIdx.y, c = blockIdx.x * TILE + threadIdx.x;
    if (r < n && c < n) tile[threadIdx.y][threadIdx.x] = x[r * n + c];
    __syncthreads();  // the whole tile is written before any thread reads a column of it
    r = blockIdx.x * TILE + threadIdx.y, c = blockIdx.y * TILE + threadIdx.x;
    if (r < n && c < n) y[r * n + c] = tile[threadIdx.x][threadIdx.y];
}
template <int S> __global__ void scale(float* x) { x[threadIdx.x] *= S; }
template __global__ void scale<3>(float*);
"""


@pytest.fixture
def tiny(tmp_path):
    (tmp_path / "tiny.cuh").write_text(TINY_HEADER)
    path = tmp_path / "tiny.cu"
    path.write_text(TINY)
    return path


@pytest.mark.parametrize("arch", cc.ARCHS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_tiny_kernel_costs(tiny, backend, arch, monkeypatch):
    monkeypatch.chdir(tiny.parent.parent)  # the header must come through -I, not the cwd
    records = cc.compile_file(tiny, arch, backend)
    check_records(tiny, records, arch)
    by_name = {r["kernel"]: r for r in records}
    tile = by_name["tile_transpose"]
    assert tile["smem"] == 16 * 17 * 4 and tile["barriers"] == 1
    assert tile["spill_stores"] == 0 and tile["backend"].startswith(backend)
    template = [r for r in records if r["symbol"].startswith("_Z")]
    assert len(template) == 1 and template[0]["barriers"] == 0
    if shutil.which("cu++filt") or shutil.which("c++filt"):
        assert "scale<3>" in template[0]["kernel"]


@pytest.mark.parametrize("binding", cc.NVRTC_BINDINGS)
def test_both_nvrtc_bindings_agree(binding, tiny, monkeypatch):
    pytest.importorskip(binding, reason=f"{binding} is not installed (the other binding is used)")
    expected = cc.compile_file(tiny, "sm_90", "nvrtc")
    monkeypatch.setattr(cc, "NVRTC_BINDINGS", (binding,))
    cc._nvrtc.cache_clear()
    try:
        got = cc.compile_file(tiny, "sm_90", "nvrtc")
    finally:
        cc._nvrtc.cache_clear()
    assert binding in got[0]["backend"]
    drop = {"backend", "compile_s"}
    strip = [{k: v for k, v in r.items() if k not in drop} for r in got]
    assert strip == [{k: v for k, v in r.items() if k not in drop} for r in expected]


def test_spills_are_reported(tmp_path):
    # 40 values live at once, capped at 32 registers a thread by __launch_bounds__(1024, 2).
    path = tmp_path / "spill.cu"
    path.write_text(
        textwrap.dedent("""\
        #define K 40
        extern "C" __global__ void __launch_bounds__(1024, 2) pairwise(const float* x, float* y) {
            float v[K];
        #pragma unroll
            for (int j = 0; j < K; ++j) v[j] = x[threadIdx.x + j * 1024];
            float acc = 0.0f;
        #pragma unroll
            for (int j = 0; j < K; ++j)
        #pragma unroll
                for (int k = 0; k < K; ++k) acc = fmaf(v[j], v[k], acc * v[(j + k) % K]);
            y[threadIdx.x] = acc;
        }
        """)
    )
    (r,) = cc.compile_file(path, "sm_90", "nvrtc")
    assert r["registers"] <= 32 and r["spill_stores"] > 0 and r["spill_loads"] > 0
    assert r["stack"] > 0  # spilled values live in the stack frame (local memory)


@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_error_carries_the_log(tmp_path, backend):
    path = tmp_path / "broken.cu"
    path.write_text(
        'extern "C" __global__ void broken(float* x) {\n    x[0] = 1.0f\n    oops;\n}\n'
    )
    with pytest.raises(cc.CompileError) as info:
        cc.compile_file(path, "sm_90", backend)
    message = str(info.value)
    assert "broken.cu(3): error" in message and "sm_90" in message  # the compiler's own line
    assert info.value.log and "error" in info.value.log


# ---------------------------------------------------------------- the parser, on real logs

# NVRTC 12.9 (nvidia-cuda-nvrtc-cu12 12.9.86), -arch=sm_80 -Xptxas=-v: NVRTC prefixes the
# stack line with "ptxas         ." and prints smem before cmem.
NVRTC_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'spill' for 'sm_80'
ptxas info    : Function properties for spill
ptxas         .     1024 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 1024 bytes cumulative stack size, 364 bytes cmem[0]
ptxas info    : Compile time = 6.766 ms
ptxas info    : Compiling entry function '_Z4tmplILi3EEvPf' for 'sm_80'
ptxas info    : Function properties for _Z4tmplILi3EEvPf
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 360 bytes cmem[0]
ptxas info    : Compile time = 0.644 ms
ptxas info    : Compiling entry function 'add' for 'sm_80'
ptxas info    : Function properties for add
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 14 registers, used 1 barriers, 1024 bytes smem, 380 bytes cmem[0]
ptxas info    : Compile time = 1.686 ms
"""  # noqa: E501

# nvcc 13.0, -arch=sm_90 -cubin --resource-usage -Xptxas -v: no cmem[0] for sm_90, smem after
# the stack size, and an out-of-line __noinline__ device function with no "Used" line.
NVCC_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'pairwise' for 'sm_90'
ptxas info    : Function properties for pairwise
    2024 bytes stack frame, 2020 bytes spill stores, 4012 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 2024 bytes cumulative stack size
ptxas info    : Compile time = 126.846 ms
ptxas info    : Compiling entry function 'tile_sum' for 'sm_90'
ptxas info    : Function properties for tile_sum
    128 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 30 registers, used 1 barriers, 128 bytes cumulative stack size, 1088 bytes smem
ptxas info    : Compile time = 3.036 ms
ptxas info    : Function properties for _Z6helperfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
"""

# The older format (CUDA 11 and before, as printed in public build logs): no barriers, no
# cumulative stack, a second constant bank.
OLD_LOG = """\
ptxas info    : Compiling entry function '_Z6kernelPfi' for 'sm_70'
ptxas info    : Function properties for _Z6kernelPfi
    296 bytes stack frame, 488 bytes spill stores, 480 bytes spill loads
ptxas info    : Used 64 registers, 4096 bytes smem, 340 bytes cmem[0], 4 bytes cmem[2]
"""


def fields(r, *keys):
    return tuple(r[k] for k in keys)


KEYS = ("symbol", "kind", "arch", "registers", "barriers", "smem", "stack")
SPILLS = ("spill_stores", "spill_loads", "cumulative_stack")


def test_parse_nvrtc_log():
    spill, tmpl, add = ptxas_log.parse_ptxas_log(NVRTC_LOG)
    assert fields(spill, *KEYS) == ("spill", "kernel", "sm_80", 32, 0, 0, 1024)
    assert fields(spill, *SPILLS) == (0, 0, 1024) and spill["cmem"] == {0: 364}
    assert fields(tmpl, *KEYS) == ("_Z4tmplILi3EEvPf", "kernel", "sm_80", 8, 0, 0, 0)
    assert fields(add, *KEYS) == ("add", "kernel", "sm_80", 14, 1, 1024, 0)
    assert add["cmem"] == {0: 380}


def test_parse_nvcc_log():
    pairwise, tile, helper = ptxas_log.parse_ptxas_log(NVCC_LOG)
    assert fields(pairwise, *KEYS) == ("pairwise", "kernel", "sm_90", 32, 0, 0, 2024)
    assert fields(pairwise, *SPILLS) == (2020, 4012, 2024) and pairwise["cmem"] == {}
    assert fields(tile, *KEYS) == ("tile_sum", "kernel", "sm_90", 30, 1, 1088, 128)
    assert fields(helper, *KEYS) == ("_Z6helperfi", "device", "sm_90", None, None, 0, 0)


def test_parse_old_format_and_duplicates():
    (r,) = ptxas_log.parse_ptxas_log(OLD_LOG + OLD_LOG)  # nvcc may print a report twice: kept once
    assert fields(r, *KEYS) == ("_Z6kernelPfi", "kernel", "sm_70", 64, None, 4096, 296)
    assert fields(r, *SPILLS) == (488, 480, None) and r["cmem"] == {0: 340, 2: 4}
    assert ptxas_log.parse_ptxas_log("") == []
    with pytest.raises(TypeError, match="log"):
        ptxas_log.parse_ptxas_log(b"ptxas info")


def test_extern_c_kernels():
    source = """
    // extern "C" __global__ void commented_out(float* x) {}
    /* extern "C" __global__ void also_out(float* x) {} */
    extern "C" __global__ void plain(float* x) {}
    extern "C" __global__ void __launch_bounds__(256, 2) bounded(float* x) {}
    extern "C"  __global__  void
        wrapped (float* x) {}
    template <int N> __global__ void not_extern_c(float* x) {}
    """
    assert ptxas_log.extern_c_kernels(source) == ["plain", "bounded", "wrapped"]


# ---------------------------------------------------------------- errors, table, command line


def test_bad_arguments(tiny):
    with pytest.raises(ValueError, match="arch"):
        cc.compile_file(tiny, "90")
    with pytest.raises(ValueError, match="backend"):
        cc.compile_file(tiny, "sm_90", "clang")
    with pytest.raises(ValueError, match="path"):
        cc.compile_file(tiny.parent / "nope.cu", "sm_90")
    with pytest.raises(ValueError, match="files"):
        cc.report(["no_such_kernel_file.cu"])


def test_no_compiler_says_what_to_install(tiny, monkeypatch):
    monkeypatch.setattr(cc, "NVRTC_BINDINGS", ("ckptlab_no_such_binding",))
    monkeypatch.setattr(cc.shutil, "which", lambda name: None)
    cc._nvrtc.cache_clear()
    try:
        with pytest.raises(cc.CompilerNotFound, match="pip install nvidia-cuda-nvrtc-cu12"):
            cc.compile_file(tiny, "sm_90")
        with pytest.raises(cc.CompilerNotFound, match="nvcc is not on the PATH"):
            cc.compile_file(tiny, "sm_90", "nvcc")
        assert not cc.backend_available("nvrtc") and not cc.backend_available("nvcc")
    finally:
        cc._nvrtc.cache_clear()


def test_format_report_and_main(tiny, tmp_path, capsys, monkeypatch):
    rows = cc.report([tiny], "sm_80")
    table = kernels_report.format_report(rows).splitlines()
    assert table[0].split()[:4] == ["file", "kernel", "arch", "regs"]
    assert len(table) == 2 + len(rows) + 1  # header, rule, one line per record, compiler
    assert any("tile_transpose" in line and "1088" in line for line in table)
    assert kernels_report.format_report([]).startswith("no kernels")

    # the command takes the .cu files of the kernels folder only: here, tiny's
    monkeypatch.setattr(kernels_report, "KERNELS_DIR", tmp_path)
    assert kernels_report.main(["--arch", "sm_80", "--arch", "sm_90", str(tiny)]) == 0
    out = capsys.readouterr().out
    assert "sm_80" in out and "sm_90" in out and "tile_transpose" in out

    broken = tmp_path / "broken.cu"
    broken.write_text('extern "C" __global__ void broken() { nope }\n')
    assert kernels_report.main([str(broken)]) == 1
    assert "broken.cu(1): error" in capsys.readouterr().err
