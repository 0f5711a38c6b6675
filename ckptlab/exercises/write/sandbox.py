"""Run a check in a child process, so that the learner's code cannot decide its verdict.

The learner's code (a kernel the emulator builds into the process that runs it, checkpoint.py
imported into it) can end that process at any moment: exit(0), os._exit(0), sys.exit(0), abort,
a signal. Run in the checking process, exit(0) would end the command with the status that
means "right". So the check runs in a child (forked from a process that has already imported
the checker, so that a check costs no extra start-up: see _context), and its verdict comes back
on a pipe this process opened, behind a random nonce drawn for this check, as the only message
on that pipe. The child's exit status is never read as a
verdict: a child that ends without one is reported as what ended it (an exit status, a signal,
the watchdog), with the learner's line where the child could record it, as a fault.

What the verdict can still not stop: Python the learner writes runs in the same interpreter as
the checker's code in the child, and could read the nonce or change that code; a kernel file
is refused first if it calls anything a GPU does not have (gpu_gate), so it cannot reach either.
"""

from __future__ import annotations

import contextlib
import hmac
import io
import multiprocessing
import os
import pickle
import re
import secrets
import signal
import sys
import threading
import time
import types
from pathlib import Path

from ckptlab import device
from ckptlab.exercises.write import feedback
from ckptlab.exercises.write.check import FAULT, WATCHDOG_S, Report, display_name

NONCE_BYTES = 32
MAX_VERDICT = 256 << 20  # a report with every case's arrays is a few MiB
MAX_OUTPUT = 64 << 10  # what the learner's code prints, shown up to this many bytes
# The whole check's limit, above the build's and the launches' own: a child still running then
# is stopped. The Python exercise has the watchdog's time and some to import and compare.
KERNEL_LIMIT_S = 900.0
PYTHON_LIMIT_S = 3 * WATCHDOG_S
_ALLOWED_NUMPY = {"_reconstruct", "scalar", "ndarray", "dtype", "_frombuffer"}
_ALLOWED_BUILTINS = {"set", "frozenset", "slice", "range", "complex", "bytearray"}


class _Unpickler(pickle.Unpickler):
    """Only the classes a report is made of: a message that names anything else is not one."""

    def find_class(self, module, name):
        if (module.startswith("ckptlab.exercises.write.")
                or (module.split(".")[0] == "numpy" and name in _ALLOWED_NUMPY)
                or (module == "builtins" and name in _ALLOWED_BUILTINS)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a report")


def _context(target: str):
    """fork where this process runs one thread (the command, a script, pytest) on the emulator:
    the child is a copy of a process that has imported the checker already, at no start-up
    cost; else forkserver (a notebook's kernel, anything with threads, which fork would copy
    mid-work; the GPU, whose driver a forked child cannot use once its parent has asked it
    anything): the child is forked from a single-threaded server started once, that imports
    the checker first."""
    if (target == "emu" and threading.active_count() == 1
            and "fork" in multiprocessing.get_all_start_methods()):
        return multiprocessing.get_context("fork")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["ckptlab.exercises.write.child"])
    return ctx


@contextlib.contextmanager
def _no_main():
    """Start the child as if this process's __main__ were empty: multiprocessing would have it
    import the caller's script again first (a notebook's, a learner's own script without an
    `if __name__ == "__main__"` guard: which would run its checks again, in the child)."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _wait(proc, limit: float) -> bool:
    """Whether `proc` ended within `limit` seconds. Asks for its exit status (waitpid) rather
    than waiting on multiprocessing's sentinel pipe, which the child closes with its other
    inherited descriptors."""
    deadline = time.monotonic() + limit
    while proc.exitcode is None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _drain(conn, keep: int, into: list) -> None:
    """Read a pipe to its end, keeping its first `keep` bytes (and counting the rest)."""
    kept, dropped = bytearray(), 0
    try:
        while chunk := os.read(conn.fileno(), 65536):
            room = keep - len(kept)
            kept += chunk[:max(room, 0)]
            dropped += max(len(chunk) - max(room, 0), 0)
    except OSError:
        pass
    into += [bytes(kept), dropped]


def _messages(conn, into: list) -> None:
    """Read the verdict pipe's messages to its end. Bytes that are not a message (a length
    beyond any report's) are kept as an empty one, which no verdict equals, and the rest is
    read to the end, so that the child is never stuck writing."""
    try:
        while True:
            into.append(conn.recv_bytes(MAX_VERDICT))
    except EOFError:
        return
    except OSError:
        into.append(b"")
        _drain(conn, 0, [])


def check(ex, file, hint: int, picture, gate: bool = True) -> Report:
    """The report of exercise `ex` on `file` (None: the learner's own), from a child process.
    `gate=False` skips refusing what a GPU refuses, to see what the child itself does."""
    path = (Path(file) if file is not None else ex.learner_file).absolute()
    nonce = secrets.token_bytes(NONCE_BYTES)
    request = {"name": ex.name, "file": str(path), "hint": hint, "target": device.target(),
               "picture": None if picture is None else str(Path(picture).absolute()),
               "gate": gate, "nonce": nonce}
    ctx = _context(request["target"])
    pipes = [ctx.Pipe(duplex=False) for _ in range(3)]  # verdict, trail, output
    from ckptlab.exercises.write import child

    proc = ctx.Process(target=child.run, args=(request, *(w for _, w in pipes)), daemon=True,
                       name=f"ckptlab check {ex.name}")
    verdicts, trail, output = [], [], []
    readers = [threading.Thread(target=_messages, args=(pipes[0][0], verdicts), daemon=True),
               threading.Thread(target=_drain, args=(pipes[1][0], MAX_OUTPUT, trail),
                                daemon=True),
               threading.Thread(target=_drain, args=(pipes[2][0], MAX_OUTPUT, output),
                                daemon=True)]
    limit = PYTHON_LIMIT_S if ex.name == "checkpoint" else KERNEL_LIMIT_S
    try:
        with _no_main():
            proc.start()
        for _, w in pipes:
            w.close()
        for t in readers:
            t.start()
        stopped = not _wait(proc, limit)
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
    for t in readers:
        t.join(5)
    for r, _ in pipes:
        r.close()
    _show(output)
    report = _verdict(verdicts, nonce, ex.name)
    if report is not None:
        return report
    return died(ex, path, proc.exitcode, _text(trail), stopped, limit)


def _text(parts: list) -> str:
    return parts[0].decode(errors="replace") if parts else ""


def _show(output: list) -> None:
    """What the learner's code printed, on this process's stdout (a notebook's cell, pytest's
    report), so that it is seen where the check's report is."""
    if output and output[0]:
        sys.stdout.write(_text(output))
        if output[1]:
            sys.stdout.write(f"\n({output[1]:,} more bytes of output not shown)\n")
        sys.stdout.flush()


def _verdict(messages: list, nonce: bytes, name: str):
    """The report the child sent, None if it sent none; a message that is not the child's one
    verdict (another message, the wrong nonce, not a report) is a fault report."""
    if not messages:
        return None
    ok = len(messages) == 1 and hmac.compare_digest(messages[0][:NONCE_BYTES], nonce)
    body = None
    if ok:
        try:
            body = _Unpickler(io.BytesIO(messages[0][NONCE_BYTES:])).load()
        except Exception:
            ok = False
    if isinstance(body, dict) and "error" in body:
        raise RuntimeError("the check itself failed (not your code):\n" + body["error"])
    if not ok or not isinstance(body, Report):
        return Report(name, FAULT, [
            f"{FAULT}: {name}: something other than the check wrote on its verdict pipe (your "
            "code?): the verdict is void: not right"], pattern="forged")
    return body


def _learner_line(trail: str, path: Path) -> int | None:
    """The learner's line the trail names last: an os._exit call, or the innermost frame in
    the learner's file of a stack faulthandler wrote (most recent call first)."""
    line = None
    for m in re.finditer(r"^exit: (.*):(\d+):", trail, flags=re.M):
        if Path(m[1]) == path:
            line = int(m[2])
    for block in re.split(r"\n(?=\S)", trail):
        for m in re.finditer(r'File "(.*)", line (\d+)', block):
            if Path(m[1]) == path:
                line = int(m[2])
                break
    return line


def died(ex, path: Path, code, trail: str, stopped: bool, limit: float) -> Report:
    """The report of a child that ended without a verdict: what ended it and where."""
    shown = display_name(path)
    steps = re.findall(r"^step: (.*)$", trail, flags=re.M)
    line = _learner_line(trail, path)
    pattern = "exit"
    if "Timeout (" in trail:
        head = (f"{FAULT}: {ex.name}: still running after {WATCHDOG_S:.0f} s (a loop that "
                "never ends?): stopped by the watchdog")
        pattern = "watchdog"
    elif stopped:
        head = f"{FAULT}: {ex.name}: the check did not finish in {limit:.0f} s: stopped"
        pattern = "watchdog"
    elif code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        head = f"{FAULT}: {ex.name}: your code ended the check's process with {name}"
    elif called := [m for m in re.finditer(r"^exit: (.*):(\d+):(.*)$", trail, flags=re.M)
                    if Path(m[1]) == path]:
        head = (f"{FAULT}: {ex.name}: your code ended the check's process with "
                f"os._exit({called[-1][3]}): no verdict, so not right")
    else:
        head = (f"{FAULT}: {ex.name}: your code ended the check's process with exit status "
                f"{code} (exit() or abort in your file?) before the check could finish: no "
                "verdict, so not right")
    lines = [head + (f", at {shown}:{line}" if line else "")]
    if line:
        try:
            lines += feedback.source_window(path.read_text(errors="replace"), line)
        except OSError:
            pass
    if steps:
        lines.append(f"while {steps[-1]}")
    return Report(ex.name, FAULT, lines, pattern=pattern)
