"""The test suite as the lent GPU machine sees it, simulated on the CPU in a fresh process:

- that machine has no nbformat or nbclient, and `pytest -m gpu` imports every test file first:
  optional packages must skip their file, not stop the collection;
- there cuda_available() is True while test files are imported: data built at import time would
  become CuPy arrays before conftest pins CPU tests to the emulator. A stand-in for the "cuda"
  array module (device.xp) that refuses every use shows that nothing is built on the detected
  target until a test runs;
- the target conftest pins follows the `gpu` marker, whatever the checkout's folder is called.
"""

import importlib.util
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Run pytest in a new interpreter after hiding packages and/or faking a detected GPU.
RUNNER = textwrap.dedent("""\
    import importlib.abc, sys, types
    BLOCKED, FORCE_CUDA, ARGS = {blocked!r}, {force_cuda!r}, {args!r}

    class Blocker(importlib.abc.MetaPathFinder):  # as if these packages were not installed
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

    class RefusingCupy(types.ModuleType):  # the detected GPU's array module, refusing all use
        def __getattr__(self, attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            raise RuntimeError(f"cupy.{{attr}} used: data made on the detected 'cuda' target")

    sys.meta_path.insert(0, Blocker())
    if FORCE_CUDA:  # CuPy's own modules still import (the NVRTC check uses them); arrays don't
        from ckptlab import device
        numpy_xp, refusing = device.xp, RefusingCupy("cupy")
        device.cuda_available = lambda: True
        device.xp = lambda name=None: (refusing if (name or device.target()) == "cuda"
                                       else numpy_xp(name))
    import pytest
    sys.exit(pytest.main(ARGS))
""")


def run_pytest(args, *, blocked=(), force_cuda=False, cwd=ROOT, timeout=300):
    code = RUNNER.format(blocked=tuple(blocked), force_cuda=force_cuda,
                         args=["-p", "no:cacheprovider", *args])
    env_code = [sys.executable, "-c", code]
    return subprocess.run(env_code, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow  # collects the whole suite in a new process
def test_gpu_tests_collect_without_nbformat_and_nbclient():
    p = run_pytest(["-m", "gpu", "--collect-only", "-q", "tests"],
                   blocked=("nbformat", "nbclient"))
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert "error" not in out.lower()
    files = {line.split("::")[0] for line in p.stdout.splitlines() if "::" in line}
    assert {"tests/test_attention_gpu.py", "tests/test_emu_gpu.py",
            "tests/test_measure.py"} <= files, files


def test_the_notebook_file_names_what_is_missing():
    p = run_pytest(["-rs", "tests/test_notebooks.py"], blocked=("nbformat",))
    assert p.returncode == 5 or "skipped" in p.stdout, p.stdout[-2000:]  # 5: nothing ran
    assert "nbformat is not installed" in p.stdout


@pytest.mark.slow  # collects the whole suite in a new process
def test_collecting_every_file_builds_nothing_on_a_detected_gpu():
    p = run_pytest(["--collect-only", "-q", "tests"], force_cuda=True)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert "tests collected" in p.stdout or "tests collected" in p.stderr


def test_a_detected_gpu_does_not_change_the_checkpoint_tests():
    """The file whose weights were once made at import passes with a GPU
    detected and every CuPy use refused: its data is made on the emulator, in a fixture."""
    p = run_pytest(["-q", "tests/test_checkpoint.py"], force_cuda=True)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert " passed" in p.stdout and "failed" not in p.stdout


@pytest.mark.slow
def test_the_cpu_suite_passes_with_a_gpu_detected():
    """Every CPU test (not gpu, not slow) with a GPU detected and CuPy refusing all use: a test
    whose data or code reached the detected target would fail here. Subprocesses the tests start
    (the CLI, notebooks) detect no GPU: that part cannot be simulated from here."""
    p = run_pytest(["-q", "-m", "not gpu and not slow and not notebooks", "-x", "tests"],
                   force_cuda=True, timeout=1200)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]


@pytest.mark.slow
def test_the_default_suite_passes_without_pytorch():
    """The README's test command on a machine without PyTorch (its venv installs none): the
    default selection, PyTorch hidden, passes; the tests that use it report themselves skipped
    with the reason. A test that needs PyTorch without saying so fails here."""
    p = run_pytest(["-q", "-rs"], blocked=("torch",), timeout=1200)  # bare: the default run
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert " passed" in p.stdout and " failed" not in p.stdout, out[-3000:]
    if importlib.util.find_spec("torch") is not None:  # hidden here, so its tests skipped
        assert "PyTorch is not installed" in p.stdout or "No module named 'torch'" in p.stdout


def test_a_checkout_folder_named_gpu_keeps_cpu_tests_on_the_emulator(tmp_path):
    """conftest follows the `gpu` marker: `"gpu" in item.keywords` also matched every test of a
    checkout in a folder named gpu (parents' names are keywords), skipping the whole suite."""
    folder = tmp_path / "gpu"
    folder.mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", folder / "conftest.py")
    (folder / "test_where.py").write_text(textwrap.dedent("""\
        import pytest
        from ckptlab import device

        def test_cpu_test_runs_on_the_emulator():
            assert device.target() == "emu"

        @pytest.mark.gpu
        def test_marked():
            assert device.target() == "cuda"
    """))
    p = run_pytest(["-q", "-rs", "--rootdir", str(folder), str(folder)], cwd=folder)
    assert "1 passed" in p.stdout, p.stdout[-2000:]
    assert "1 skipped" in p.stdout and "needs an NVIDIA GPU" in p.stdout
