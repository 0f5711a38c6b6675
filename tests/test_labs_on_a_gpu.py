"""What the labs do on a GPU, without one: the GPU's name, its arch, its free memory or CUDA
being there are forced (as tests/test_lab_on_a_t4.py forces the arch) and the lab's own cells
are run in this process (tests/lab_cells.py). Four things read from the code that a GPU would
have shown: lab 01 asked about the H100 while its figure drew the GPU it ran on (on a T4 the
answer is 48 and the curve bent at 61); lab 04 planned 17 GB of S and P on a 15 GiB T4; lab 07's
table gave a T4 a bf16 tensor-core peak it does not have; lab 12 ran on the emulator on a Colab
GPU without a word."""

import numpy as np
import pytest

# tests/lab_cells.py reads notebooks (nbformat, requirements-dev): a machine without it, such
# as the lent GPU machine, skips this file with the reason instead of failing the collection
pytest.importorskip("nbformat", reason="nbformat is not installed (requirements-dev)")
from lab_cells import code_cell, run  # noqa: E402

from ckptlab import device
from ckptlab.exercises import lab01, sizes
from ckptlab.kernels import archs
from ckptlab.measure import roofline, traffic

GIB = 2**30


def bend(xs, ys) -> tuple[float, float]:
    """The grid interval in which a modeled time first grows: (last flat k, first rising k)."""
    k = int(np.argmax(np.asarray(ys) > ys[0] * (1 + 1e-9)))
    return xs[k - 1], xs[k]


def test_lab01_draws_the_gpu_exercise_4_asks_about(monkeypatch):
    ns = {}
    run(code_cell("01", "# Seeds first"), ns)
    ns["SPEC"] = roofline.spec("T4")["name"]  # what cell 15 picks on a T4
    run(code_cell("01", "# Modeled time of softmax_rows"), ns)
    lines = {line.get_label(): line for line in ns["fig"].axes[0].lines}
    assert set(lines) == {"H100-SXM5-80GB (exercise 4)", "T4 (this GPU)"}, set(lines)
    sm = traffic.softmax_rows(4096, 4096)
    for name, gpu in (("H100-SXM5-80GB (exercise 4)", "H100"), ("T4 (this GPU)", "T4")):
        lo, hi = bend(lines[name].get_xdata(), lines[name].get_ydata())
        factor = roofline.ridge_point(gpu) / (sm.flops / sm.bytes)  # 48 and 61
        assert lo <= factor <= hi, (name, lo, factor, hi)
    assert lab01.free_flops(48.0, R=4096, C=4096, device="H100") == "right"
    assert "device=\"H100\"" in code_cell("01", "# Exercise 4")


def test_lab04_sizes_its_sweep_from_a_t4s_free_memory(monkeypatch):
    monkeypatch.setattr(device, "target", lambda: "cuda")
    monkeypatch.setattr(device, "free_bytes", lambda: 15 * GIB)
    sizes.reset()
    try:
        ns = {}
        run(code_cell("04", "# Seeds first"), ns)
        assert ns["SCALE"] == "gpu"
        run(code_cell("04", "# The sweep's sizes"), ns)
    finally:
        sizes.reset()
    B, H, d = ns["B"], ns["H"], ns["d"]
    need = [traffic.BYTES * B * H * n * (2 * n + 4 * d) for n in ns["NS"]]
    assert 8192 not in ns["NS"] and ns["NS"][-1] == 4096, ns["NS"]
    assert max(need) <= sizes.FREE_FRACTION * 15 * GIB
    monkeypatch.setattr(device, "free_bytes", lambda: 80 * GIB)  # an A100 takes N = 8192
    assert sizes.fitting([4096, 8192], lambda n: 4 * B * H * n * (2 * n + 4 * d))[-1] == 8192
    with pytest.raises(ValueError, match="no size fits"):
        sizes.fitting([8192], lambda n: 4 * B * H * n * (2 * n + 4 * d), free=GIB)


def test_lab07_gives_a_t4_its_fp16_peak_not_a_bf16_one(monkeypatch):
    monkeypatch.setattr(archs, "current_arch", lambda: "sm_75")
    ns = {}
    run(code_cell("07", "# Seeds first"), ns)
    table = run(code_cell("07", "# The two ridges of each GPU"), ns)
    rows = {line.split()[0]: line for line in table.splitlines()[1:]}
    t4 = rows["T4"]
    assert "fp16" in t4 and "bf16" not in t4, t4
    assert all("bf16" in r for name, r in rows.items() if roofline.spec(name)["arch"] >= "sm_80")
    assert "bf16 TC" not in table.splitlines()[0]


def test_lab12_says_it_runs_on_the_emulator_on_a_gpu(monkeypatch):
    torch = pytest.importorskip("torch", reason="lab 12 runs PyTorch: pip install -e '.[torch]'")
    from ckptlab import emu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a Colab runtime's GPU
    monkeypatch.setattr(emu, "configure", lambda **kw: None)  # keep this process's settings
    said = run(code_cell("12", "# Seeds first"), {})
    assert "kernels run on its CPU emulator" in said and "a GPU is here and unused" in said, said
