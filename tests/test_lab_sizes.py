"""The labs' size knob (ckptlab.exercises.sizes): one setting, CKPTLAB_LAB_SCALE or the first
cell's LAB_SCALE, picks every lab's sizes; "gpu" is the default on a GPU and refused without
one; every lab that grows its sizes asks the knob rather than testing for a GPU itself."""

import re
from pathlib import Path

import pytest

from ckptlab import device
from ckptlab.exercises import sizes

nbformat = pytest.importorskip("nbformat", reason="reading the notebooks needs nbformat "
                                "(requirements-dev.txt)")

LABS = Path(__file__).resolve().parent.parent / "labs"


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    sizes.reset()
    monkeypatch.delenv(sizes.ENV, raising=False)
    yield
    sizes.reset()


def test_default_is_small_on_the_emulator_and_the_env_picks_large(monkeypatch):
    monkeypatch.setattr(device, "target", lambda: "emu")
    assert sizes.scale() == "small"
    assert sizes.pick(small=1, large=2, gpu=3) == 1
    monkeypatch.setenv(sizes.ENV, "Large")
    assert sizes.scale() == "large" and sizes.pick(small=1, large=2, gpu=3) == 2
    assert sizes.pick(small=1) == 1  # large defaults to small


def test_first_cell_override_wins_and_gpu_needs_a_gpu(monkeypatch):
    monkeypatch.setattr(device, "target", lambda: "emu")
    monkeypatch.setenv(sizes.ENV, "small")
    assert sizes.scale("large") == "large" and sizes.scale() == "large"  # it stays
    with pytest.raises(ValueError, match="needs the cuda target"):
        sizes.scale("gpu")
    with pytest.raises(ValueError, match="expected one of"):
        sizes.scale("huge")


def test_gpu_is_the_default_on_cuda(monkeypatch):
    monkeypatch.setattr(device, "target", lambda: "cuda")
    assert sizes.scale() == "gpu"
    assert sizes.pick(small=1, large=2, gpu=3) == 3
    assert sizes.pick(small=1, large=2) == 2  # gpu defaults to large


@pytest.mark.parametrize("lab", ["01", "02", "03", "04", "05", "06", "07", "08", "09", "10"])
def test_each_lab_takes_its_sizes_from_the_knob(lab):
    nbformat = pytest.importorskip("nbformat", reason="reading the notebooks needs nbformat")
    (path,) = LABS.glob(f"{lab}_*.ipynb")
    code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells
                     if c.cell_type == "code")
    assert "LAB_SCALE = None" in code and "sizes.scale(LAB_SCALE)" in code
    assert "sizes.pick(" in code
    sized_by_gpu = re.findall(r"^\s*(?:NS|Ls|size|B, H, d|B, H, N, d)\s*=.*\bif ON_GPU\b", code,
                              flags=re.M)
    assert not sized_by_gpu, f"sizes chosen by ON_GPU, not the knob: {sized_by_gpu}"
