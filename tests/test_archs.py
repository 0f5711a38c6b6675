"""Which GPUs run which kernels (ckptlab.kernels.archs), without compiling: a T4 (sm_75) runs the
fp32 kernels and the float16 tensor-core ones, and refuses bf16 and tf32 wmma with the reason
before any compile; the table of methods x dtypes x arches says the same; the labs' 16-bit
type follows the arch. Compiling every kernel for every arch: tests/test_compile.py (slow)."""

import ml_dtypes
import numpy as np
import pytest

from ckptlab import device
from ckptlab.cli import kernels_report
from ckptlab.device import KERNELS_DIR
from ckptlab.kernels import archs, flash_tc, nvrtc, table

BF16_FWD = table.tc_names("__nv_bfloat16", 64)["fwd_flash"]
HALF_FWD = table.tc_names("__half", 64)["fwd_flash"]


@pytest.mark.parametrize("arch", list(archs.ARCHS))
def test_each_arch_supports_what_its_tensor_cores_take(arch):
    n = archs.arch_number(arch)
    for f in ("attn_flash_fwd.cu", "attn_flash_bwd.cu", "attn_naive_fwd.cu"):
        assert archs.supported(f, arch) == table.instantiations(f)  # fp32: everywhere
    tc = archs.supported("attn_flash_fwd_tc.cu", arch) + \
        archs.supported("attn_flash_bwd_tc.cu", arch)
    has_bf16 = any("__nv_bfloat16" in k for k in tc)
    assert has_bf16 == (n >= 80), arch
    assert any("__half" in k for k in tc), arch
    gemm = archs.supported("wmma_gemm.cu", arch)
    assert gemm == (table.instantiations("wmma_gemm.cu") if n >= 80 else ["wmma_gemm<__half>"])


def test_a_t4_refuses_bf16_and_tf32_with_the_reason():
    reason = archs.refusal(BF16_FWD, "sm_75")
    assert "bfloat16" in reason and "sm_80" in reason and "T4" in reason and "float16" in reason
    assert "tf32" in archs.refusal("wmma_gemm<float>", "sm_75")
    assert archs.refusal(HALF_FWD, "sm_75") is None
    for arch in ("sm_80", "sm_86", "sm_89", "sm_90"):
        assert archs.refusal(BF16_FWD, arch) is None
    # shared memory: the d = 256 fp16 dK/dV kernel needs 85504 bytes; sm_75 allows 64 KiB
    big = table.tc_names("__half", 256)["dkdv_flash_False"]
    assert table.dynamic_shared_bytes(big) > 64 * 1024
    assert "65536" in archs.refusal(big, "sm_75") and archs.refusal(big, "sm_86") is None
    assert set(archs.refused("attn_flash_bwd_tc.cu", "sm_90")) == set()


def test_refused_before_any_compile(monkeypatch):
    """compile_file raises ArchUnsupported with the reason, and no compiler is even looked up."""
    def no_compiler(*a, **k):
        raise AssertionError("a compiler was reached")

    monkeypatch.setattr(nvrtc, "_pick_backend", no_compiler)
    with pytest.raises(nvrtc.ArchUnsupported, match="bfloat16 tensor cores .* need sm_80"):
        nvrtc.compile_file(KERNELS_DIR / "attn_flash_fwd_tc.cu", "sm_75", instantiations=[BF16_FWD])


@pytest.mark.parametrize("dtype,runs", [(ml_dtypes.bfloat16, False), (np.float16, True)])
def test_the_wrapper_refuses_bf16_on_a_t4_before_loading(monkeypatch, dtype, runs):
    """With the GPU seen as a T4, the bf16 launch stops with the reason before device.load (the
    compile); fp16 goes on to load (here the emulator's)."""
    loaded = []
    monkeypatch.setattr(archs, "current_arch", lambda: "sm_75")
    real = device.load
    monkeypatch.setattr(device, "load", lambda *a, **k: loaded.append(a) or real(*a, **k))
    q = np.random.default_rng(1).standard_normal((1, 1, 17, 16)).astype(dtype)
    if runs:
        O, _ = flash_tc.tc_forward("flash", q, q, q)
        assert np.isfinite(device.to_numpy(O).astype(np.float32)).all() and loaded
    else:
        with pytest.raises(ValueError, match="cannot run on sm_75: bfloat16 tensor cores"):
            flash_tc.tc_forward("flash", q, q, q)
        assert loaded == []


def test_the_support_table():
    rows = {(r["method"], r["dtype"]): r for r in archs.support_table()}
    tc = "stored, flash (tensor cores)"
    assert rows[("naive, stored, flash", "float32")]["sm_75"] == "runs"
    assert rows[(tc, "bfloat16")]["sm_75"].startswith("refused: bfloat16 tensor cores")
    assert rows[(tc, "float16")]["sm_75"].startswith("runs, except tile head dim 256")
    assert rows[("wmma_gemm", "tf32")]["sm_75"].startswith("refused: tf32")
    assert all(r[a] == "runs" for r in rows.values() for a in ("sm_80", "sm_86", "sm_89", "sm_90"))
    text = archs.format_support_table(list(rows.values()))
    assert "| stored, flash (tensor cores) | bfloat16 | no (2) | yes |" in text, text


def test_the_readme_shows_the_table_as_the_code_computes_it():
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert archs.format_support_table(archs.support_table()) in readme


def test_the_labs_pick_fp16_where_bf16_is_refused():
    assert archs.tc_dtype("sm_75") == "float16"
    assert {archs.tc_dtype(a) for a in ("sm_80", "sm_86", "sm_89", "sm_90")} == {"bfloat16"}
    with pytest.raises(ValueError, match="expected one of"):
        archs.arch_number("sm_70")


def test_the_time_model_leaves_out_what_a_gpu_cannot_run(capsys):
    """bench crossing on a T4: no bf16 rows (its tensor cores have none), the reason printed."""
    from ckptlab.cli import bench_crossing
    from ckptlab.measure import crossing, roofline

    for name, entry in roofline.SPECS.items():  # every GPU of the table is an arch known here
        assert entry["arch"] in archs.ARCHS, name
    assert crossing.recompute_gains(["T4"], ["bf16"], [64], N=256) == []
    assert "sm_80" in archs.dtype_refusal("bf16", "sm_75")
    assert archs.dtype_refusal("fp16", "sm_75") is None
    assert archs.dtype_refusal("fp32", "sm_75") is None
    assert bench_crossing.main(["--gpus", "t4", "--dtype", "bf16", "--d", "64", "--n", "256"]) == 0
    assert "T4 bf16: skipped (not modeled), attn_flash_fwd_tc: bfloat16 tensor cores (wmma) " \
        "need sm_80" in capsys.readouterr().out


# a dtype's C type in an instantiation's name, as ptxas names it (table.WMMA_TYPES, TC_TYPES)
CTYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16", "tf32": "float"}


@pytest.mark.parametrize("arch", list(archs.ARCHS))
def test_dtype_refusal_says_what_refusal_says_for_every_kernel_of_the_dtype(arch):
    """dtype_refusal(dtype, arch) is None exactly when refusal() lets some tensor-core
    instantiation of that dtype run on arch, and then gives that reason: tf32 on a T4 too
    (wmma_gemm<float>), which it once said ran."""
    files = ("attn_flash_fwd_tc.cu", "attn_flash_bwd_tc.cu", "wmma_gemm.cu")
    for alias, name in archs.DTYPE_NAMES.items():
        got = archs.dtype_refusal(alias, arch)
        if name == "float32":
            assert got is None
            continue
        mine = [k for f in files for k in table.instantiations(f)
                if f"<{CTYPES[name]}" in k.replace(" ", "")]
        reasons = [archs.refusal(k, arch) for k in mine]
        assert mine and (got is None) == (None in reasons), (alias, arch, got)
        if got is not None:
            assert got == reasons[0]
    assert archs.dtype_refusal("tf32", "sm_75") == archs.refusal("wmma_gemm<float>", "sm_75")
    assert "sm_80" in archs.dtype_refusal("TF32", 75)
    with pytest.raises(ValueError, match="expected one of"):
        archs.dtype_refusal("int8", arch)


def test_kernels_support_cli_needs_no_compiler(capsys, monkeypatch):
    monkeypatch.setattr(nvrtc, "_pick_backend", lambda *a: pytest.fail("compiled"))
    assert kernels_report.main(["--support"]) == 0
    out = capsys.readouterr().out
    assert "sm_75 (T4)" in out and "bfloat16 tensor cores (wmma) need sm_80" in out
    refused = kernels_report.format_refused(["wmma_gemm.cu"], ["sm_75", "sm_90"])
    assert refused.splitlines() == [
        f"sm_75  wmma_gemm.cu  wmma_gemm<{t}>: refused, {archs.refusal(f'wmma_gemm<{t}>', 'sm_75')}"
        for t in ("__nv_bfloat16", "float")]
    with pytest.raises(SystemExit) as e:
        kernels_report.main(["--arch", "sm_61"])
    assert e.value.code == 2
