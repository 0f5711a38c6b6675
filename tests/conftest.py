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
                               "as an independent oracle (pip install torch; CI does)")


@pytest.fixture(autouse=True)
def _target(request):
    """Pin the target per test: "cuda" for gpu-marked tests, the emulator for all others."""
    name = "cuda" if wants_gpu(request.node) else "emu"
    with device.use(name), emu.settings(mode="counted", race_check=True):
        yield
