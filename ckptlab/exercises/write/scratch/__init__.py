"""The from-scratch track: the learner writes whole kernel bodies from the mathematics.

Each file labs/exercises/scratch/<name>.cu gives the includes, every kernel's signature (the
template parameters and arguments the lab's wrappers launch), the launch geometry, the shared
memory the wrappers budget for and, in its header, the spec in mathematics; each kernel body the
learner writes is one `>>> YOUR CODE` block. Its shipped text is the template beside this module
(<name>.cu, package data): `exercise reset scratch/<name>` writes it back.

A scratch exercise is its guided exercise (spec.Exercise: the same cases, comparisons,
diagnosis and hints) under the name "scratch/<name>": only the learner's file and its shipped
text differ. Its solution is the same kernel file the guided exercise is cut from.

    from ckptlab.exercises import write
    write.check("scratch/flash_forward")     # labs/exercises/scratch/flash_forward.cu
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from ckptlab import device
from ckptlab.exercises.write import check as _check
from ckptlab.exercises.write import regions
from ckptlab.exercises.write.flash import FLASH_BACKWARD, FLASH_FORWARD
from ckptlab.exercises.write.rows import NAIVE_DS, ROW_SOFTMAX

PREFIX = "scratch/"
TEMPLATES = Path(__file__).resolve().parent
TITLES = ((ROW_SOFTMAX, "a row softmax in one warp, from its mathematics"),
          (NAIVE_DS, "the softmax's backward dS = P (dP - D), from its mathematics"),
          (FLASH_FORWARD, "the whole FlashAttention forward, from its mathematics"),
          (FLASH_BACKWARD, "the whole FlashAttention backward (dK, dV, dQ), from its mathematics"))
SCRATCH = {PREFIX + base.name: dataclasses.replace(base, name=PREFIX + base.name, title=title)
           for base, title in TITLES}

# a YOUR CODE block's title names the kernel whose body it holds
BODY_TITLE = re.compile(r"^the body of (?P<kernel>\w+)$")
KERNEL = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(?P<name>\w+)\s*\(")
GIVEN = re.compile(r"^\s*(static_assert|__shared__)\b")  # the lines a scratch file gives
STEP_REF = re.compile(r"^(hint \d: )Steps? \d+(?:(?:-|, | and )\d+)*: ")


def is_scratch(ex) -> bool:
    """Whether `ex` (an exercise or its name) is of the from-scratch track."""
    return (ex if isinstance(ex, str) else ex.name).startswith(PREFIX)


def for_file(ex, file, exercises: dict):
    """The exercise that checks `file`: `ex`, or its twin on the other track when the file's
    YOUR CODE blocks are that track's (blocks titled "the body of <kernel>" are a scratch file's),
    so that `check flash_forward --file labs/exercises/scratch/flash_forward.cu` is the scratch
    check. `exercises`: every exercise by name. A file that cannot be read is left to the check."""
    if file is None:
        return ex
    try:
        blocks = regions.steps(Path(file).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return ex
    if not blocks:
        return ex
    from_scratch = all(BODY_TITLE.match(b.title) for b in blocks)
    base = ex.name.removeprefix(PREFIX)
    twin = exercises.get(PREFIX + base if from_scratch else base)
    return ex if twin is None else twin


def template(ex) -> Path:
    """The shipped file of scratch exercise `ex` inside the package."""
    return TEMPLATES / f"{ex.name.removeprefix(PREFIX)}.cu"


def shipped_text(ex) -> str:
    """The learner's file as shipped: the template, unchanged."""
    return template(ex).read_text()


def _code(line: str) -> str:
    return line.split("//")[0]


def kernel_bodies(source: str) -> dict:
    """{kernel name: the lines of its body} of a kernel file, without the lines a scratch file
    gives (static_assert, __shared__) and without the guided exercises' markers: what a
    learner who wrote the lab's own kernel would have put in its YOUR CODE block."""
    lines = source.splitlines()
    text = "\n".join(lines)
    out = {}
    for m in KERNEL.finditer(text):
        first = text.count("\n", 0, text.index("{", m.end())) + 1  # the line after the `{`
        depth, n = 1, first
        while depth:
            depth += _code(lines[n]).count("{") - _code(lines[n]).count("}")
            n += 1
        out[m["name"]] = [ln for ln in lines[first:n - 1]
                          if not GIVEN.match(ln) and not regions.BEGIN.match(ln)
                          and not regions.END.match(ln)]
    return out


def fill(learner: str, kernel_source: str) -> str:
    """The learner's file with each YOUR CODE block holding the body of the kernel it names,
    as `kernel_source` has it: the lab's own kernel written from scratch (the tests plant
    mistakes in it)."""
    bodies = kernel_bodies(kernel_source)
    out, skip = [], False
    for line in learner.splitlines():
        if m := regions.YOURS_BEGIN.match(line):
            out.append(line)
            out += bodies[BODY_TITLE.match(m["title"].strip())["kernel"]]
            skip = True
        elif regions.YOURS_END.match(line):
            out.append(line)
            skip = False
        elif not skip:
            out.append(line)
    return "\n".join(out) + "\n"


def solution(ex) -> str:
    """The bodies a learner writes, as the lab's kernels have them."""
    bodies = kernel_bodies((device.KERNELS_DIR / ex.kernel).read_text())
    out = [f"exercise {ex.name}: the solution is kernels/{ex.kernel}; the bodies you write:"]
    for s in regions.steps(shipped_text(ex)):
        kernel = BODY_TITLE.match(s.title)["kernel"]
        out += [f"\nstep {s.step}: the body of {kernel}", *bodies[kernel]]
    return "\n".join(out)


def check(ex, file=None, hint: int = 1, picture=None):
    """The guided exercise's check on the scratch file (labs/exercises/scratch/<name>.cu, or
    `file`), "not attempted" measured against the scratch file's own shipped text. Two things
    differ from the guided report: a hint's reference to a guided step ("Step 2: ...") is
    dropped, the scratch file having no such step; and a file whose cases are all right while
    a kernel body is still as shipped is not right (no case launched that kernel, the lab
    does)."""
    shipped = shipped_text(ex)
    report = _check.check(ex, file, hint, picture, shipped=shipped)
    report.lines = [STEP_REF.sub(r"\1", line) for line in report.lines]
    if report.status != _check.RIGHT:
        return report
    path = Path(file) if file is not None else ex.learner_file
    left = [s for s in regions.steps(shipped)
            if s.step in regions.untouched_steps(path.read_text(encoding="utf-8"), shipped)]
    if not left:
        return report
    names = ", ".join(f"step {s.step} ({s.title})" for s in left)
    return _check.Report(ex.name, _check.WRONG, [
        f"{_check.WRONG}: {ex.name}: every case is right, but {names} is still as shipped: "
        "no case launched that kernel, and the lab does; write it, then check again",
        *report.lines[1:2]], pattern="untouched")
