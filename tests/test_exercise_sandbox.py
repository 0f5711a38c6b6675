"""A learner's code cannot make the check say "right" by ending it: the check runs that code in a
child process and takes the verdict only from the pipe it opened, behind a nonce; a child that
ends without one is a fault that says what ended it and, where it can be known, the line. The
same holds for the Python API, `exercise check` (its exit status) and `pytest
tests/test_my_kernels.py`. A kernel file is also refused before it is built when a GPU would
refuse it (tests/test_gpu_rules.py has the rules one by one)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_kernel_exercises import solved

from ckptlab import device
from ckptlab.exercises import write
from ckptlab.exercises.write import sandbox
from ckptlab.exercises.write.check import FAULT, NO_BUILD, WATCHDOG_S

ROOT = device.KERNELS_DIR.parent
SOLUTION = write.get("checkpoint").solution_file.read_text()
IN_FORWARD = "    rng = tape.rng_state()  # what dropout draws"
IN_BACKWARD = "        now = tape.rng_state()\n"
AT_IMPORT = "from ckptlab.engine.tensor import Tensor, make\n"
STEP1_START = "    y = fn(x)"  # the forward's fn(x), inside no_grad


def checkpoint_with(tmp_path, anchor: str, code: str, before: bool = True) -> Path:
    """The solution with `code` (lines at the anchor's indentation) inserted before `anchor`
    (or after it)."""
    assert anchor in SOLUTION, anchor
    indent = re.match(r"\s*", anchor.lstrip("\n"))[0]
    block = "".join(f"{indent}{ln}\n" for ln in code.splitlines())
    text = SOLUTION.replace(anchor, block + anchor if before else anchor + block, 1)
    path = tmp_path / "checkpoint.py"
    path.write_text(text)
    return path


def line_of(path: Path, needle: str) -> int:
    return next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if needle in ln)


def kernel_with(tmp_path, code: str, where="float m = -INFINITY, l = 0.0f;") -> Path:
    """naive_softmax solved, with `code` after the line `where` (inside the kernel) or, with
    where=None, before the first kernel (namespace scope)."""
    text = solved("naive_softmax")
    if where is None:
        text = text.replace('extern "C"', code + '\nextern "C"', 1)
    else:
        assert where in text
        text = text.replace(where, where + " " + code, 1)
    path = tmp_path / "naive_softmax.cu"
    path.write_text(text)
    return path


def cli(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptlab", "exercise", "check", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


# ---- kernels: refused before they are built (the default suite) ------------------------------
@pytest.mark.parametrize("code, word", [("exit(0);", "exit"), ('system("true");', "system")])
def test_a_kernel_that_calls_exit_or_system_does_not_build(tmp_path, code, word):
    path = kernel_with(tmp_path, code)
    report = write.check("naive_softmax", file=path)
    assert report.status == NO_BUILD and not report.ok, str(report)
    line = line_of(path, code)
    assert f"naive_softmax.cu:{line}: `{word}` is a host function" in str(report), str(report)
    assert "Traceback" not in str(report)


def test_a_static_constructor_that_calls_exit_does_not_build(tmp_path):
    path = kernel_with(tmp_path, "struct Quit { Quit() { exit(0); } };\nstatic Quit quit;",
                       where=None)
    report = write.check("naive_softmax", file=path)
    assert report.status == NO_BUILD, str(report)
    text = str(report)
    assert f":{line_of(path, 'static Quit quit;')}: a global object of class Quit" in text
    assert f":{line_of(path, 'Quit() { exit(0); }')}: `exit` is a host function" in text


def test_the_command_exits_not_right_on_an_exit_kernel_in_one_clear_report(tmp_path):
    out = cli("naive_softmax", "--file", str(kernel_with(tmp_path, "exit(0);")))
    assert out.returncode == 1, (out.returncode, out.stdout, out.stderr)
    assert out.stdout.startswith(f"{NO_BUILD}: naive_softmax"), out.stdout
    assert "Traceback" not in out.stdout + out.stderr


# ---- checkpoint.py: what ends or escapes the check (the default suite) -----------------------
@pytest.mark.parametrize("anchor, code, what", [
    (IN_FORWARD, "import sys; sys.exit(0)", "SystemExit(0)"),
    (IN_FORWARD, "exit(0)", "SystemExit(0)"),
    (AT_IMPORT, "exit(0)", "SystemExit(0)"),
    (IN_BACKWARD, "raise SystemExit(3)", "SystemExit(3)"),
    (IN_FORWARD, "class Stop(BaseException): pass\nraise Stop('enough')", "Stop('enough')"),
    (IN_FORWARD, "raise KeyboardInterrupt", "KeyboardInterrupt()"),
])
def test_a_python_exit_or_base_exception_is_a_fault_at_its_line(tmp_path, anchor, code, what):
    path = checkpoint_with(tmp_path, anchor, code)
    report = write.check("checkpoint", file=path)
    assert report.status == FAULT and not report.ok, str(report)
    line = line_of(path, code.splitlines()[-1])
    assert f"your code raised {what} at " in str(report), str(report)
    assert f"checkpoint.py:{line}:" in str(report).splitlines()[0], str(report)
    assert re.search(rf"^\s+{line} > ", str(report), flags=re.M), str(report)
    assert "Traceback" not in str(report)


@pytest.mark.parametrize("anchor", [IN_FORWARD, AT_IMPORT])
def test_os_exit_zero_is_a_fault_with_the_line_that_called_it(tmp_path, anchor):
    path = checkpoint_with(tmp_path, anchor, "import os; os._exit(0)")
    report = write.check("checkpoint", file=path)
    assert report.status == FAULT, str(report)
    assert "ended the check's process with os._exit(0)" in str(report)
    assert f"checkpoint.py:{line_of(path, 'os._exit(0)')}" in str(report), str(report)


def test_a_signal_is_named(tmp_path):
    path = checkpoint_with(tmp_path, IN_FORWARD, "import os, signal; os.kill(os.getpid(), "
                           "signal.SIGKILL)")
    report = write.check("checkpoint", file=path)
    assert report.status == FAULT and "with SIGKILL" in str(report), str(report)


def test_abort_is_named_with_its_line(tmp_path):
    path = checkpoint_with(tmp_path, IN_FORWARD, "import os; os.abort()")
    report = write.check("checkpoint", file=path)
    assert report.status == FAULT and "with SIGABRT" in str(report), str(report)
    assert f"checkpoint.py:{line_of(path, 'os.abort()')}" in str(report), str(report)


def test_printing_right_or_writing_on_every_pipe_gives_no_verdict(tmp_path, capsys):
    """What the learner's code prints is shown, and is not a verdict; bytes written on every
    open pipe (the verdict's among them) void the verdict."""
    path = checkpoint_with(tmp_path, IN_FORWARD, "print('right'); import os; os._exit(0)")
    report = write.check("checkpoint", file=path)
    assert report.status == FAULT and "right" in capsys.readouterr().out
    path = checkpoint_with(tmp_path, AT_IMPORT, "import os, stat\nfor fd in range(3, 256):\n"
                           "    try:\n        if stat.S_ISFIFO(os.fstat(fd).st_mode):\n"
                           "            os.write(fd, b'right')\n    except OSError: pass")
    report = write.check("checkpoint", file=path)
    assert report.status == FAULT and report.pattern == "forged", str(report)


def test_the_command_and_the_notebook_cell_say_fault_for_os_exit_zero(tmp_path):
    path = checkpoint_with(tmp_path, IN_FORWARD, "import os; os._exit(0)")
    out = cli("checkpoint", "--file", str(path))
    assert out.returncode == 1 and out.stdout.startswith(f"{FAULT}: checkpoint"), out
    assert str(write.in_notebook("checkpoint", file=path)).startswith(f"{FAULT}: checkpoint")


def test_a_verdict_with_another_nonce_or_class_is_void():
    nonce = b"n" * sandbox.NONCE_BYTES
    ok = write.Report("checkpoint", "right", ["right"])
    import pickle

    assert sandbox._verdict([nonce + pickle.dumps(ok)], nonce, "checkpoint").ok
    assert not sandbox._verdict([b"m" * sandbox.NONCE_BYTES + pickle.dumps(ok)], nonce,
                                "checkpoint").ok
    assert not sandbox._verdict([nonce + pickle.dumps(ok)] * 2, nonce, "checkpoint").ok
    assert not sandbox._verdict([b"", nonce + pickle.dumps(ok)], nonce, "checkpoint").ok
    evil = nonce + pickle.dumps(os.system)  # a global outside the report's classes
    assert sandbox._verdict([evil], nonce, "checkpoint").pattern == "forged"


# ---- the child alone, with the GPU rules off: how it reports an ended process (slow) ---------
@pytest.mark.slow
@pytest.mark.parametrize("code, where, line_text", [
    ("exit(0);", "float m = -INFINITY, l = 0.0f;", None),
    ("struct Quit { Quit() { exit(0); } };\nstatic Quit quit;", None, None),
])
def test_without_the_gpu_rules_an_exit_in_the_kernel_is_still_a_fault(tmp_path, code, where,
                                                                       line_text):
    path = kernel_with(tmp_path, code, where)
    report = sandbox.check(write.get("naive_softmax"), path, 1, None, gate=False)
    assert report.status == FAULT and not report.ok, str(report)
    assert "exit status 0" in str(report), str(report)


@pytest.mark.slow
@pytest.mark.parametrize("anchor", [IN_FORWARD, IN_BACKWARD, AT_IMPORT])
def test_a_checkpoint_that_never_returns_is_stopped_by_the_watchdog_at_its_line(tmp_path,
                                                                               anchor):
    path = checkpoint_with(tmp_path, anchor, "while True:\n    pass")
    report = write.check("checkpoint", file=path)
    assert (report.status, report.pattern) == (FAULT, "watchdog"), str(report)
    assert f"still running after {WATCHDOG_S:.0f} s" in str(report)
    loop = line_of(path, "while True:")
    named = int(re.search(r"checkpoint\.py:(\d+)", str(report))[1])
    assert named in (loop, loop + 1), str(report)


@pytest.mark.slow
def test_pytest_on_my_kernels_fails_exit_kernels_and_exiting_checkpoints(tmp_path):
    """tests/test_my_kernels.py on a labs folder whose naive_softmax.cu calls exit(0) in its
    kernel and whose checkpoint.py calls sys.exit(0): both fail (today pytest itself ends)."""
    folder = tmp_path / "exercises"
    folder.mkdir()
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "checkpoint.py").write_text(SOLUTION)
    for ex in write.EXERCISES.values():
        (folder / ex.learner_file.name).write_text(write.shipped_text(ex))
    kernel_with(folder, "exit(0);")
    checkpoint_with(folder, IN_FORWARD, "import sys; sys.exit(0)")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          str(ROOT / "tests" / "test_my_kernels.py")], capture_output=True,
                         text=True, cwd=ROOT, timeout=600,
                         env={**os.environ, "CKPTLAB_LABS": str(tmp_path),
                              "PYTHONPATH": str(ROOT)})
    assert out.returncode == 1, out.stdout + out.stderr
    skipped = len(write.EXERCISES) + len(write.SCRATCH) - 2  # the rest: not attempted, missing
    assert f"2 failed, {skipped} skipped" in out.stdout, out.stdout
    assert "does not build: naive_softmax" in out.stdout
    assert "fault: checkpoint: your code raised SystemExit(0)" in out.stdout


def test_code_that_turns_the_watchdog_off_is_stopped_by_the_checks_own_limit(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setattr(sandbox, "PYTHON_LIMIT_S", 2.0)
    path = checkpoint_with(tmp_path, IN_FORWARD, "import faulthandler\n"
                           "faulthandler.cancel_dump_traceback_later()\nwhile True:\n    pass")
    report = write.check("checkpoint", file=path)
    assert (report.status, report.pattern) == (FAULT, "watchdog"), str(report)
    assert "the check did not finish in 2 s: stopped" in str(report), str(report)


def test_the_child_finds_every_exercise_the_package_lists():
    from ckptlab.exercises.write import child

    assert all(child.exercise(name) is ex for name, ex in write.EXERCISES.items())


def test_the_child_is_forked_only_from_one_thread_on_the_emulator(monkeypatch):
    """The choice reads how many threads this process runs (a test suite may have left some: a
    progress bar's monitor, a reader of an earlier check), so each count is set here."""
    monkeypatch.setattr(sandbox.threading, "active_count", lambda: 1)
    assert sandbox._context("emu").get_start_method() == "fork"
    assert sandbox._context("cuda").get_start_method() == "forkserver"
    monkeypatch.setattr(sandbox.threading, "active_count", lambda: 2)
    assert sandbox._context("emu").get_start_method() == "forkserver"


def test_from_a_process_with_threads_the_check_still_runs_in_a_child(tmp_path):
    """A notebook's kernel runs threads: the child comes from the forkserver there."""
    import threading

    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        path = checkpoint_with(tmp_path, IN_FORWARD, "import os; os._exit(0)")
        report = write.check("checkpoint", file=path)
        assert report.status == FAULT and "os._exit(0)" in str(report), str(report)
        assert write.check("checkpoint", file=write.get("checkpoint").solution_file).ok
    finally:
        stop.set()
        other.join()


@pytest.mark.slow
def test_what_a_kernel_prints_is_shown(tmp_path, capsys):
    path = kernel_with(tmp_path, 'if (i == 0 && lane == 0 && blockIdx.y == 0) printf("row zero '
                       'here\\n");')
    report = write.check("naive_softmax", file=path)
    assert report.ok, str(report)
    assert "row zero here" in capsys.readouterr().out
