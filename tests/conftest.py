"""Test-wide rules: CPU tests run on the emulator (with its race check on) even on a machine
with a GPU; tests marked `gpu` run on the CUDA target and are skipped, with the reason, where
there is no GPU. A test that takes the `torch` fixture uses PyTorch as an independent oracle
and is skipped, with the reason, where PyTorch is not installed (the README's venv; CI
installs it)."""

import pytest

from ckptlab import device, emu

NO_GPU = ("needs an NVIDIA GPU and a CUDA build of CuPy: cupy.cuda.is_available() is False on "
          "this machine")


def wants_gpu(node) -> bool:
    """Marked `gpu` (by the test, its class or its module). Not `"gpu" in node.keywords`: the
    keywords also hold every parent's name, so a checkout in a folder named gpu would match."""
    return node.get_closest_marker("gpu") is not None


def pytest_collection_modifyitems(config, items):
    if device.cuda_available():
        return
    skip = pytest.mark.skip(reason=NO_GPU)
    for item in items:
        if wants_gpu(item):
            item.add_marker(skip)


@pytest.fixture
def torch():
    """The torch module, or a skip that says PyTorch is missing (never a silent pass)."""
    return pytest.importorskip("torch", reason="PyTorch is not installed: this test uses it "
                               "as an independent oracle (pip install -e '.[torch]'; CI does)")


# What an emulated test runs in unless it asks: see _target.
DEFAULT_EMU = dict(mode="counted", race_check=True)
COUNTED_EMU = dict(mode="counted", race_check=True)


@pytest.fixture(autouse=True)
def _target(request):
    """Pin the target per test: "cuda" for gpu-marked tests, the emulator for all others. A
    test marked `counted` (it reads byte counts, or relies on the bounds checks or the race
    check) runs in counted mode with the race check; the others run in DEFAULT_EMU."""
    name = "cuda" if wants_gpu(request.node) else "emu"
    emu_settings = COUNTED_EMU if request.node.get_closest_marker("counted") else DEFAULT_EMU
    with device.use(name), emu.settings(**emu_settings):
        yield


@pytest.fixture
def no_cuda_compiler(monkeypatch):
    """As on a machine with no CUDA compiler: measure.occupancy falls back to the tile table
    (its caches cleared before and after, so no record compiled elsewhere leaks in or out)."""
    from pathlib import Path

    from ckptlab.kernels import nvrtc
    from ckptlab.measure import occupancy

    def missing(*args, **kwargs):
        raise nvrtc.CompilerNotFound("no CUDA compiler here (test)")

    monkeypatch.setattr(nvrtc, "compile_file", missing)
    monkeypatch.setattr(occupancy.build, "cache_dir", lambda: Path("/nonexistent-ckptlab-cache"))
    occupancy.resources.cache_clear()
    occupancy._compiled.cache_clear()
    yield
    occupancy.resources.cache_clear()
    occupancy._compiled.cache_clear()
