"""Lab 07 (tensor cores) on a T4, without one: a T4 (sm_75) has float16 tensor cores but no
bfloat16 or tf32 wmma. The lab picks its 16-bit type through archs.tc_dtype(current_arch()),
loads wmma_gemm for that one type (ckptlab.kernels.wmma), and labels what it runs by the type
that ran. Here the arch is forced to sm_75 (archs.current_arch patched, as tests/test_archs.py
does) and every kernel the lab asks for is recorded: none may be a bf16 or tf32 one."""

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from ckptlab import device
from ckptlab.kernels import archs, wmma

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (requirements-dev)")

LAB = Path(__file__).resolve().parent.parent / "labs" / "07_tensor_cores.ipynb"
REFUSED_ON_A_T4 = re.compile(r"__nv_bfloat16|wmma_gemm<float>")


def recording_loads(monkeypatch) -> list:
    """Patch device.load to record (file, name_expressions) and go on to load."""
    loaded, real = [], device.load
    monkeypatch.setattr(device, "load", lambda f, options=(), name_expressions=None:
                        loaded.append((f, tuple(name_expressions or ()))) or
                        real(f, options, name_expressions))
    return loaded


def test_the_gemm_compiles_only_the_type_a_t4_takes(monkeypatch):
    monkeypatch.setattr(archs, "current_arch", lambda: "sm_75")
    loaded = recording_loads(monkeypatch)
    tc = archs.tc_dtype(archs.current_arch())
    assert tc == "float16"
    f = wmma.gemm(np.dtype(tc))
    assert loaded == [("wmma_gemm.cu", ("wmma_gemm<__half>",))]
    for dtype in (ml_dtypes.bfloat16, np.float32):  # bf16, and tf32 (float inputs)
        with pytest.raises(ValueError, match="cannot run on sm_75"):
            wmma.gemm(dtype)
    assert len(loaded) == 1  # refused before loading (compiling)
    M, N, K = 19, 33, 21  # odd: every tile has a tail
    rng = np.random.default_rng(3)
    A, B = rng.standard_normal((M, K)).astype(tc), rng.standard_normal((K, N)).astype(tc)
    C = np.full((M, N), np.nan, np.float32)
    f((-(-N // 16), -(-M // 16)), (32,), (A, B, C, np.int32(M), np.int32(N), np.int32(K)))
    truth = A.astype(np.float64) @ B.astype(np.float64)
    assert np.abs(C - truth).max() < 1e-5 * np.abs(truth).max()  # fp16 products exact in fp32


def test_the_gemm_on_newer_arches_and_bad_types(monkeypatch):
    monkeypatch.setattr(archs, "current_arch", lambda: "sm_80")
    loaded = recording_loads(monkeypatch)
    wmma.gemm(ml_dtypes.bfloat16)
    assert loaded == [("wmma_gemm.cu", ("wmma_gemm<__nv_bfloat16>",))]
    with pytest.raises(ValueError, match="dtype: expected one of"):
        wmma.gemm(np.float64)
    assert archs.tc_dtype(None) == "bfloat16"  # the emulator runs every type
    assert archs.tc_dtype("sm_100") == "bfloat16"  # an arch newer than the table


def test_lab07_takes_its_16bit_type_from_the_arch():
    """The notebook names no 16-bit type where the arch decides it: no wmma instantiation, no
    cast to bfloat16 and no 'bf16' label outside the modeled tables of named GPUs."""
    code = "\n".join(c.source for c in nbformat.read(LAB, as_version=4).cells
                     if c.cell_type == "code")
    assert "archs.tc_dtype(archs.current_arch())" in code
    assert "wmma.gemm(T16)" in code
    assert not REFUSED_ON_A_T4.search(code), REFUSED_ON_A_T4.search(code)
    assert ".astype(BF16)" not in code


@pytest.mark.notebooks
def test_lab07_runs_as_on_a_t4(monkeypatch):
    """The whole notebook on the emulator with the GPU seen as a T4: it runs, asks for no bf16 or
    tf32 kernel, and its rows say fp16 where fp16 ran."""
    NotebookClient = pytest.importorskip("nbclient").NotebookClient  # noqa: N806

    nb = nbformat.read(LAB, as_version=4)
    as_t4 = ("from ckptlab import device\nfrom ckptlab.kernels import archs\n"
             "archs.current_arch = lambda: 'sm_75'\nASKED, _load = [], device.load\n"
             "def _recording(f, options=(), name_expressions=None):\n"
             "    ASKED.extend(name_expressions or ())\n"
             "    return _load(f, options, name_expressions)\n"
             "device.load = _recording")
    nb.cells.insert(0, nbformat.v4.new_code_cell(as_t4))
    nb.cells.append(nbformat.v4.new_code_cell("print(sorted(set(ASKED)))"))
    monkeypatch.setenv("CKPTLAB_DEVICE", "emu")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(LAB.parent)}}).execute()
    text = {k: "".join(o.get("text", "") for o in c.outputs) for k, c in enumerate(nb.cells)
            if c.cell_type == "code"}
    asked = text[len(nb.cells) - 1]
    assert "wmma_gemm<__half>" in asked and "attn_flash_fwd_tc<__half" in asked, asked
    assert not REFUSED_ON_A_T4.search(asked), asked
    everything = "".join(text.values())
    assert "tensor cores run: float16" in everything
    assert "wmma_gemm (fp16)" in everything and "wmma_gemm (bf16)" not in everything
    assert "fp16/fp32" in everything and "bf16/fp32" not in everything
