"""Build errors and faults, told against the learner's own file and line, in a few lines.

A compile error shows the compiler's first error in the learner's file (or, when the first one
is in a header, that one and the learner's line that led there), the line itself and a caret,
and how many more errors there were: never the compiler's command line. A fault shows the
emulator's message (kernel, block, thread, line) and the source lines around that line.
"""

from __future__ import annotations

import re
from pathlib import Path

from ckptlab import device

# g++: "file:line:col: error: message"; NVRTC (CuPy on a GPU): "file(line): error: message"
GXX = re.compile(r"^(?P<file>[^:\s][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)? "
                 r"(?P<sev>fatal error|error): (?P<msg>.*)$")
NVRTC = re.compile(r"^(?P<file>[^(\s][^(]*)\((?P<line>\d+)\): (?P<sev>error): (?P<msg>.*)$")
NOTE = re.compile(r"^(?P<file>[^:\s][^:]*):(?P<line>\d+):(?:\d+:)? +required from here$")


def source_window(text: str, line: int, before: int = 3, after: int = 2,
                  col: int | None = None) -> list[str]:
    """Numbered lines around `line` (1-based) of `text`, the line itself marked with '>'."""
    lines = text.splitlines()
    out = []
    for n in range(max(1, line - before), min(len(lines), line + after) + 1):
        out.append(f"  {n:4d} {'>' if n == line else ' '} {lines[n - 1]}")
        if n == line and col:
            out.append("         " + " " * (col - 1) + "^")
    return out


def _header_text(file: str) -> str | None:
    path = device.KERNELS_DIR / Path(file).name
    return path.read_text() if path.is_file() else None


def compile_report(message: str, shown: str, text: str) -> list[str]:
    """Lines telling a build failure of the learner's file `shown` (its text `text`)."""
    errors, notes = [], []
    for raw in message.splitlines():
        line = raw.strip()
        if m := (GXX.match(line) or NVRTC.match(line)):
            errors.append(m)
        elif m := NOTE.match(line):
            notes.append(m)
    if not errors:
        tail = [ln for ln in message.splitlines() if ln.strip() and not ln.startswith("$")]
        return ["the kernel does not build:"] + [f"  {ln}" for ln in tail[-4:]]

    def mine(m) -> bool:
        return Path(m["file"]).name == Path(shown).name

    first = next((m for m in errors if mine(m)), errors[0])
    where = f"{shown}:{first['line']}" if mine(first) else f"{first['file']}:{first['line']}"
    out = [f"your kernel does not build: {where}: {first['msg']}"]
    col = int(first["col"]) if first.groupdict().get("col") else None
    if mine(first):
        out += source_window(text, int(first["line"]), 2, 1, col)
    else:
        header = _header_text(first["file"])
        if header:
            out += source_window(header, int(first["line"]), 1, 0, col)
        from_me = next((n for n in notes if mine(n)), None)
        if from_me:
            out += [f"reached from your line {from_me['line']}:"]
            out += source_window(text, int(from_me["line"]), 0, 0)
    more = len(errors) - 1
    if more:
        out.append(f"({more} more error{'s' if more > 1 else ''} after this one; fix the first "
                   "and build again)")
    return out


def fault_report(err, shown: str, text: str) -> list[str]:
    """Lines telling a fault the emulator stopped the learner's kernel with."""
    out = [f"your kernel stopped with a fault: {err}"]
    file, line = getattr(err, "file", None), getattr(err, "line", None)
    if line and file and Path(file).name == Path(shown).name:
        out += source_window(text, int(line))
    elif line and file and (header := _header_text(file)):
        out += [f"in {Path(file).name}, which your kernel calls:"]
        out += source_window(header, int(line), 2, 1)
    return out


KINDS = {"race": "race", "access": "access", "barrier": "barrier", "warp": "warp",
         "watchdog": "watchdog", "stack": "stack"}


def fault_pattern(err) -> str:
    """The hint key of a fault: race (shared memory), global_race, access, barrier, warp, or
    fault."""
    kind = KINDS.get(getattr(err, "kind", None) or "", "fault")
    if kind == "race" and "global-memory race" in str(err):
        return "global_race"
    return kind
