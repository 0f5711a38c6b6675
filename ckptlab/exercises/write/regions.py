"""The lines a learner writes, marked in the kernels themselves.

In kernels/*.cu the lines that are the lesson of an exercise sit between two comments:

    // >>> flash_forward 2: the online softmax: m, alpha, l, and this tile's P
    ...the kernel's own lines...
    // <<< flash_forward 2

`cut()` turns a kernel file into the learner's file: each region of that exercise becomes a
"YOUR CODE" block (the step's title, what it needs and gives, and a placeholder that keeps the
file compiling), every other exercise's markers are dropped and their lines kept. `steps()`
finds the blocks again in the learner's file, so a checker can tell a step left as shipped
from one written. The kernel file is the solution: nothing is kept twice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# `//` in C++ and CUDA, `#` in Python
BEGIN = re.compile(r"^(?P<indent>\s*)(?P<c>//|#) >>> (?P<name>\w+) (?P<step>\d+): "
                   r"(?P<title>.*?)\s*$")
END = re.compile(r"^\s*(?://|#) <<< (?P<name>\w+) (?P<step>\d+)\s*$")
YOURS_BEGIN = re.compile(r"^\s*(?://|#) >>> YOUR CODE, step (?P<step>\d+) of (?P<of>\d+): "
                         r"(?P<title>.*)$")
YOURS_END = re.compile(r"^\s*(?://|#) <<< end of step (?P<step>\d+)\s*$")


class MarkerError(ValueError):
    """A kernel file's exercise markers do not pair up."""


@dataclass(frozen=True)
class Region:
    """One step's lines in a kernel file: 0-based line numbers [first, last] of its markers."""

    name: str
    step: int
    title: str
    indent: str
    comment: str  # "//" or "#"
    first: int  # the `// >>>` line
    last: int   # the `// <<<` line
    body: tuple  # the lines between them


def regions(source: str) -> list[Region]:
    """Every marked region of every exercise in `source`, in file order of their start."""
    lines = source.splitlines()
    open_: list = []
    found: list[Region] = []
    for n, line in enumerate(lines):
        if m := BEGIN.match(line):
            open_.append((m, n))
        elif m := END.match(line):
            if not open_ or (open_[-1][0]["name"], open_[-1][0]["step"]) != (m["name"], m["step"]):
                raise MarkerError(f"line {n + 1}: '// <<< {m['name']} {m['step']}' closes no "
                                  "region that is open")
            b, first = open_.pop()
            found.append(Region(b["name"], int(b["step"]), b["title"], b["indent"], b["c"],
                                first, n, tuple(lines[first + 1:n])))
    if open_:
        m, n = open_[-1]
        raise MarkerError(f"line {n + 1}: '// >>> {m['name']} {m['step']}' is never closed")
    return sorted(found, key=lambda r: r.first)


def exercise_regions(source: str, name: str) -> list[Region]:
    """The regions of exercise `name`, by step number; steps must run 1, 2, ... without gaps."""
    mine = sorted((r for r in regions(source) if r.name == name), key=lambda r: r.step)
    if not mine:
        raise MarkerError(f"no region of exercise {name!r} is marked")
    if [r.step for r in mine] != list(range(1, len(mine) + 1)):
        raise MarkerError(f"exercise {name!r}: steps {[r.step for r in mine]}, expected 1.."
                          f"{len(mine)}")
    return mine


def your_block(region: Region, of: int, notes: tuple, placeholder: tuple) -> list[str]:
    """The lines that replace a region in the learner's file."""
    pad, c = region.indent, region.comment
    return ([f"{pad}{c} >>> YOUR CODE, step {region.step} of {of}: {region.title}"]
            + [f"{pad}{c}     {n}" if n else f"{pad}{c}" for n in notes]
            + [f"{pad}{p}" for p in placeholder]
            + [f"{pad}{c} <<< end of step {region.step}"])


def cut(source: str, name: str, notes: dict, placeholders: dict, header: tuple = ()) -> str:
    """The learner's file: exercise `name`'s regions replaced by YOUR CODE blocks (`notes` and
    `placeholders`: step -> lines), the markers of other exercises removed, `header` comment
    lines on top."""
    mine = exercise_regions(source, name)
    lines = source.splitlines()
    skip = {n for r in mine for n in range(r.first, r.last + 1)}
    starts = {r.first: r for r in mine}
    others = {r.first for r in regions(source) if r.name != name} | {
        r.last for r in regions(source) if r.name != name}
    out = list(header)
    for n, line in enumerate(lines):
        if n in starts:
            r = starts[n]
            out += your_block(r, len(mine), notes.get(r.step, ()), placeholders.get(r.step, ()))
        elif n not in skip and n not in others:
            out.append(line)
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class Step:
    """A YOUR CODE block found in a learner's file: 1-based line numbers of its markers."""

    step: int
    of: int
    title: str
    begin: int
    end: int
    body: tuple  # the lines between the markers


def steps(source: str) -> list[Step]:
    """The YOUR CODE blocks of a learner's file, in file order ([] if the markers are gone)."""
    lines = source.splitlines()
    found, open_ = [], None
    for n, line in enumerate(lines, start=1):
        if m := YOURS_BEGIN.match(line):
            open_ = (m, n)
        elif (m := YOURS_END.match(line)) and open_ and open_[0]["step"] == m["step"]:
            b, first = open_
            found.append(Step(int(b["step"]), int(b["of"]), b["title"].strip(), first, n,
                              tuple(lines[first:n - 1])))
            open_ = None
    return found


def _norm(body) -> list[str]:
    """A block's lines as they compare: trailing spaces and blank lines ignored."""
    return [ln.strip() for ln in body if ln.strip()]


def untouched_steps(learner: str, shipped: str) -> list[int]:
    """The steps whose block in the learner's file is still as shipped."""
    ship = {s.step: _norm(s.body) for s in steps(shipped)}
    return [s.step for s in steps(learner) if ship.get(s.step) == _norm(s.body)]


def not_attempted(learner: str, shipped: str) -> bool:
    """True when every line is as shipped (blank lines and trailing spaces aside)."""
    return _norm(learner.splitlines()) == _norm(shipped.splitlines())


def solution_lines(source: str, name: str) -> list[tuple[int, str, list[str]]]:
    """(step, title, the kernel's own lines) of each step of exercise `name`, the nested
    markers of other exercises left out."""
    out = []
    for r in exercise_regions(source, name):
        body = [ln for ln in r.body if not BEGIN.match(ln) and not END.match(ln)]
        out.append((r.step, r.title, body))
    return out


def fill(learner: str, kernel: str, name: str) -> str:
    """The learner's file with every YOUR CODE block holding the kernel's own lines: the
    solved exercise, as a learner who got it right would have it (mistakes are planted in it
    by the tests)."""
    solved = {step: lines for step, _, lines in solution_lines(kernel, name)}
    lines = learner.splitlines()
    out, skip = [], False
    for line in lines:
        if m := YOURS_BEGIN.match(line):
            out.append(line)
            out += solved[int(m["step"])]
            skip = True
        elif YOURS_END.match(line):
            out.append(line)
            skip = False
        elif not skip:
            out.append(line)
    return "\n".join(out) + "\n"
