"""Test-wide rules.

- What runs: a bare `pytest` runs the default selection, DEFAULT_SELECTION below: every
  kernel's gradients, the engine and schedules, the emulator's checks and the labs' checkers, in
  a few minutes. The rest runs under its marker: `pytest -m slow` (long sweeps, every arch and
  compiler, whole-suite reruns), `pytest -m notebooks` (every lab, top to bottom), `pytest -m
  torch` (the tests that use PyTorch; skipped without it), `pytest -m gpu` (CUDA; skipped
  without a GPU), `pytest -m "slow or not slow"` everything. A test named on the command line
  (a file or an id) runs whatever its markers.
- Where: CPU tests run on the emulator even on a machine with a GPU, in its fast mode unless
  marked `counted` (counted mode with the race check: for tests that read byte counts or rely
  on the bounds or race checks); tests marked `gpu` run on the CUDA target and are skipped, with
  the reason, where there is no GPU.
- Optional packages: a test that takes the `torch` fixture, or lives in a module that imports
  PyTorch, is marked `torch` and skipped, with the reason, where PyTorch is not installed.
"""

import pytest

from ckptlab import device, emu

DEFAULT_SELECTION = "not slow and not notebooks"

NO_GPU = ("needs an NVIDIA GPU and a CUDA build of CuPy: cupy.cuda.is_available() is False on "
          "this machine")


def wants_gpu(node) -> bool:
    """Marked `gpu` (by the test, its class or its module). Not `"gpu" in node.keywords`: the
    keywords also hold every parent's name, so a checkout in a folder named gpu would match."""
    return node.get_closest_marker("gpu") is not None


def pytest_configure(config):
    """A bare `pytest` (no -m, no test named) runs DEFAULT_SELECTION."""
    from_testpaths = config.args_source == pytest.Config.ArgsSource.TESTPATHS
    if from_testpaths and not config.option.markexpr:
        config.option.markexpr = DEFAULT_SELECTION


def pytest_report_header(config):
    if config.option.markexpr == DEFAULT_SELECTION:
        return [f"default selection: -m '{DEFAULT_SELECTION}' (pytest -m slow, -m notebooks, "
                "-m torch for the rest; -m 'slow or not slow' for everything)"]
    return []


def uses_torch(item) -> bool:
    """Takes the torch fixture, or its module imported PyTorch (torch_oracle's skip)."""
    if "torch" in getattr(item, "fixturenames", ()):
        return True
    module = getattr(item, "module", None)
    return getattr(getattr(module, "torch", None), "__name__", "") == "torch"


@pytest.hookimpl(tryfirst=True)  # before -m selects: the torch marker must be there
def pytest_collection_modifyitems(config, items):
    for item in items:
        if uses_torch(item):
            item.add_marker(pytest.mark.torch)
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
DEFAULT_EMU = dict(mode="fast", race_check=False)
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
def ctrl_c_raises():
    """Python's own Ctrl-C handler for the test: a process started with SIGINT ignored (a
    background job of a shell, nohup under some shells) keeps it ignored, and a Ctrl-C that
    reaches Python between launches would then raise nothing."""
    import signal
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture
def no_cuda_compiler(monkeypatch):
    """As on a machine with no CUDA compiler: measure.occupancy falls back to the tile table
    (its cache cleared before and after, so no record compiled elsewhere leaks in or out)."""
    from ckptlab.kernels import nvrtc
    from ckptlab.measure import occupancy

    def missing(*args, **kwargs):
        raise nvrtc.CompilerNotFound("no CUDA compiler here (test)")

    monkeypatch.setattr(nvrtc, "compile_file", missing)
    occupancy.resources.cache_clear()
    occupancy._compiled.cache_clear()
    yield
    occupancy.resources.cache_clear()
    occupancy._compiled.cache_clear()
