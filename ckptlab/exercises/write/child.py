"""The process a check runs the learner's code in (started by sandbox.py, never by hand).

It receives the request and three pipes from the parent: the verdict pipe, a trail and the
output. The learner's code runs here and nowhere else: the kernel, built by the emulator into
this process, or checkpoint.py, imported into it. What the check found goes back on the verdict
pipe once, as the report pickled behind the nonce the parent drew for this check; the parent
takes the verdict from that alone, never from how this process ends. Before each step that runs
the learner's code, a line on the trail says what it is ("running case base (...)"), so that a
process ended by that code (exit(0), abort, a signal) can still be told where. Here:

  - every file descriptor it inherited is closed but these three pipes and 0;
  - fds 1 and 2, and sys.stdout and sys.stderr, are the output pipe (the parent shows what the
    learner's code printed);
  - Ctrl-C is ignored (it reaches the parent, which stops this process): any KeyboardInterrupt
    raised here is the learner's;
  - os._exit writes the line that called it on the trail first;
  - faulthandler writes the Python stack on the trail on a fatal signal, and, for the Python
    exercise, after WATCHDOG_S seconds (then ends the process): the watchdog, at the line the
    learner's code was on;
  - a kernel file is first refused if a GPU would refuse it (gpu_gate), and its builds get a
    time limit (CHECK_BUILD_LIMIT_S).
"""

from __future__ import annotations

import ctypes
import faulthandler
import importlib
import os
import pickle
import signal
import sys
import traceback
from pathlib import Path

from ckptlab import device, emu
from ckptlab.exercises.write import checkpoint_ex, feedback, gpu_gate, regions, scratch
from ckptlab.exercises.write.check import FAULT, WATCHDOG_S, Report, display_name

# the module, not write.check (the package's function of that name)
kernel_check = importlib.import_module("ckptlab.exercises.write.check")

# a g++ run on one learner file still going after this long is stopped (the labs' kernel files
# build in seconds; a busy shared machine may take several times as long)
CHECK_BUILD_LIMIT_S = 120.0


def check_here(ex, path: Path, hint: int, picture, gate: bool, say=lambda s: None) -> Report:
    """The check itself, in this process: gate, then the kernel or checkpoint check."""
    if ex is checkpoint_ex.CHECKPOINT:
        say(f"checking {display_name(path)} (importing it, then each case)")
        faulthandler.dump_traceback_later(WATCHDOG_S, exit=True, file=_TRAIL[0])
        try:
            return checkpoint_ex.check(path, hint)
        finally:
            faulthandler.cancel_dump_traceback_later()
    later = None
    if path.is_file():
        text, bad = kernel_check.read_learner(path, display_name(path))
        shipped = (scratch.shipped_text(ex) if scratch.is_scratch(ex)
                   else kernel_check.shipped_text(ex))
        if bad is None and not regions.not_attempted(text, shipped):
            say("reading your kernel as a GPU's compiler would")
            refused, later = (gpu_gate.gate(ex, text, display_name(path)) if gate else
                              (gpu_gate.missing_kernel(ex, text, display_name(path)), None))
            if refused is not None:
                return refused
    from ckptlab.emu import build, loader

    try:
        build.BUILD_LIMIT_S = min(build.build_limit_s(), CHECK_BUILD_LIMIT_S)
    except emu.EmuCompileError:
        pass  # a malformed setting: the build says so, as the check's "does not build"
    run, build_module = ex.run, loader.build_module

    def traced(case, inputs):
        say(f"building and running case {case.label} ({case.describe()})")
        return run(case, inputs)

    def built(code, name, *args, **kwargs):
        """g++'s build, then NVRTC's word before the library is loaded: a refusal stops the
        check there (a plain mistake g++ refuses first is told by g++ as usual)."""
        out = build_module(code, name, *args, **kwargs)
        if later is not None and name == display_name(path):
            say("waiting for NVRTC's word on your file")
            refused = later()
            if refused is not None:
                raise _Refused(refused)
        return out

    ex.run, loader.build_module = traced, built
    try:
        if scratch.is_scratch(ex):
            return scratch.check(ex, path, hint, picture)
        return kernel_check.check(ex, path, hint, picture)
    except _Refused as e:
        return e.args[0]
    finally:
        ex.run, loader.build_module = run, build_module


class _Refused(BaseException):
    """Raised through the check's own `except Exception` to stop before a refused file loads;
    carries the report."""


_TRAIL: list = [None]


def raised(ex, path: Path, e: BaseException) -> Report:
    """A BaseException the learner's Python raised (SystemExit, KeyboardInterrupt, its own):
    what it is and the learner's line, as a fault."""
    line = None
    for frame, n in traceback.walk_tb(e.__traceback__):
        if Path(frame.f_code.co_filename) == path:
            line = n
    shown = display_name(path)
    what = f"{type(e).__name__}({', '.join(map(repr, e.args))})"
    where = f" at {shown}:{line}" if line else ""
    lines = [f"{FAULT}: {ex.name}: your code raised {what}{where}: it ends the program it runs "
             "in (a training run too), so the check stops here: not right"]
    if line:
        lines += feedback.source_window(path.read_text(errors="replace"), line, 2, 1)
    if ex is checkpoint_ex.CHECKPOINT:
        lines.append("checkpoint() returns its output; to report a problem, raise an Exception")
    return Report(ex.name, FAULT, lines, pattern="exit")


def exercise(name: str):
    """The exercise called `name`, from the modules that define them (the package's own
    registry, write.EXERCISES, is the one the parent looked it up in: this module is below it)."""
    from ckptlab.exercises.write import flash, rows, wmma
    from ckptlab.exercises.write.spec import Exercise

    for module in (flash, rows, wmma):
        for value in vars(module).values():
            if isinstance(value, Exercise) and value.name == name:
                return value
    if name == checkpoint_ex.CHECKPOINT.name:
        return checkpoint_ex.CHECKPOINT
    if scratch.is_scratch(name) and name in scratch.SCRATCH:
        return scratch.SCRATCH[name]
    raise KeyError(f"no exercise {name!r}")


def _close_all_but(*keep: int) -> None:
    """Close every file descriptor but these: a forked child has all of its parent's open
    (pytest's capture files, a terminal), which the learner's code has no business with."""
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for fd in fds:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def run(request: dict, verdict, trail, output) -> None:
    """The child's whole life: set up, check, send the verdict once."""
    nonce = request.pop("nonce")
    _close_all_but(0, 1, 2, verdict.fileno(), trail.fileno(), output.fileno())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.dup2(output.fileno(), 1)
    os.dup2(output.fileno(), 2)
    output.close()
    # Python's own streams on those fds (a forked child has its parent's: pytest's capture)
    sys.stdout = open(1, "w", buffering=1, closefd=False, errors="replace")
    sys.stderr = open(2, "w", buffering=1, closefd=False, errors="replace")
    _TRAIL[0] = trail

    def say(text: str) -> None:
        try:
            os.write(trail.fileno(), f"step: {text}\n".encode(errors="replace"))
        except OSError:
            pass

    real_exit = os._exit

    def _exit(code=0):
        frame = sys._getframe(1)
        try:
            os.write(trail.fileno(), f"exit: {frame.f_code.co_filename}:{frame.f_lineno}:"
                     f"{code}\n".encode(errors="replace"))
        except OSError:
            pass
        real_exit(code)

    os._exit = _exit
    faulthandler.enable(file=trail)
    device.use(request["target"])
    ex, path = exercise(request["name"]), Path(request["file"])
    try:
        report = check_here(ex, path, request["hint"], request["picture"], request["gate"], say)
        message = pickle.dumps(report)
    except Exception:  # the checker's own error: the parent raises it with this traceback
        message = pickle.dumps({"error": traceback.format_exc()})
    except BaseException as e:  # only the learner's code raises these here
        message = pickle.dumps(raised(ex, path, e))
    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.CDLL(None).fflush(None)  # a kernel's printf, in C's buffer: this process ends by _exit
    verdict.send_bytes(nonce + message)
    verdict.close()
