"""Code the learner writes: each kernel exercise is a real kernel of kernels/ with the lines
that are its lesson cut out, in the learner's own file labs/exercises/<name>.cu; `checkpoint`
is checkpoint() itself, labs/exercises/checkpoint.py, cut from labs/solutions/checkpoint.py.

    from ckptlab.exercises import write
    print(write.check("flash_forward"))          # builds, runs, compares, diagnoses
    write.check("flash_forward", hint=2)         # the second, more specific hint
    write.reset("flash_forward")                 # the file back as shipped

The from-scratch track (scratch/__init__.py) gives only the signatures, the launch and the spec
in mathematics; its exercises are named "scratch/<name>" (row_softmax, naive_ds, flash_forward,
flash_backward; files labs/exercises/scratch/<name>.cu) and take the same calls.

`python -m ckptlab exercise list|status|check|reset|solution` is the same from a shell, and
`pytest tests/test_my_kernels.py` checks every file that was attempted. The solution of each
exercise is the kernel it was cut from (kernels/<file>.cu, the kernel the labs run);
`solution(name)` shows just the lines a learner writes.
"""

from __future__ import annotations

from pathlib import Path

from ckptlab import device
from ckptlab.exercises.verdict import Verdict
from ckptlab.exercises.write import check as _check
from ckptlab.exercises.write import checkpoint_ex, files, regions, sandbox, scratch
from ckptlab.exercises.write.check import NOT_ATTEMPTED, RIGHT, WRONG, Report
from ckptlab.exercises.write.flash import DROPOUT_BACKWARD, FLASH_BACKWARD, FLASH_FORWARD
from ckptlab.exercises.write.rows import NAIVE_DS, NAIVE_SOFTMAX, ROW_SOFTMAX
from ckptlab.exercises.write.spec import EXERCISE_DIR, Exercise
from ckptlab.exercises.write.wmma import WMMA_TILE_EXERCISE

KERNELS = {ex.name: ex for ex in (ROW_SOFTMAX, NAIVE_SOFTMAX, NAIVE_DS, FLASH_FORWARD,
                                  FLASH_BACKWARD, DROPOUT_BACKWARD, WMMA_TILE_EXERCISE)}
EXERCISES = {**KERNELS, "checkpoint": checkpoint_ex.CHECKPOINT}  # in lab order
SCRATCH = scratch.SCRATCH  # the from-scratch track: "scratch/<name>"

__all__ = ["EXERCISES", "EXERCISE_DIR", "KERNELS", "NOT_ATTEMPTED", "RIGHT", "SCRATCH", "WRONG",
           "Exercise", "Report", "check", "get", "in_notebook", "reset", "shipped_text",
           "solution", "status"]


def shipped_text(ex) -> str:
    """The learner's file as shipped (`ex` an exercise or its name)."""
    ex = get(ex) if isinstance(ex, str) else ex
    if ex is checkpoint_ex.CHECKPOINT:
        return checkpoint_ex.shipped_text()
    if scratch.is_scratch(ex):
        return scratch.shipped_text(ex)
    return _check.shipped_text(ex)


def get(name: str) -> Exercise:
    if name in SCRATCH:
        return SCRATCH[name]
    if name not in EXERCISES:
        raise KeyError(f"no exercise {name!r}; the exercises are: {', '.join(EXERCISES)}, "
                       f"and from scratch {', '.join(SCRATCH)}")
    return EXERCISES[name]


def check(name: str, file=None, hint: int = 1, picture=None) -> Report:
    """Build and check the learner's kernel for exercise `name` (labs/exercises/<name>.cu, or
    `file`); `hint` 1 or 2 picks the grade of the hint a wrong answer gets; `picture`, a .png,
    .pdf or .svg path, draws which block wrote each element of the outputs and which elements
    are wrong (kernel exercises; ValueError for a file there that ckptlab did not draw). The
    learner's code runs in a child process (sandbox.py): an exit there is a fault, never the
    verdict."""
    if hint not in (1, 2):
        raise ValueError(f"hint must be 1 or 2, got {hint!r}")
    ex = scratch.for_file(get(name), file, {**EXERCISES, **SCRATCH})
    if picture is not None:
        if ex is checkpoint_ex.CHECKPOINT:
            raise ValueError("checkpoint is Python: it has no access picture")
        files.picture_format(picture)  # before any work: a name it may not draw over
    return sandbox.check(ex, file, hint, picture)  # the learner's code runs in a child process


def in_notebook(name: str, file=..., hint: int = 1) -> Verdict:
    """The check as a lab's cell shows it: the report as a Verdict (its first line "right",
    "wrong: ...", "not attempted: ...", "does not build: ..." or "fault: ..."). `file` is `...`
    or None for the learner's own file."""
    report = check(name, None if file is ... or file is None else file, hint)
    return Verdict(str(report))


def status(name: str, file=None) -> str:
    """'not attempted', 'attempted' or 'missing', from the file alone (nothing is built). A
    file that is not UTF-8 (an editor's other encoding) differs from the shipped one, so it is
    'attempted'; a byte-order mark does not count."""
    ex = scratch.for_file(get(name), file, {**EXERCISES, **SCRATCH})
    path = Path(file or ex.learner_file)
    try:
        text = files.text_anyway(path)
    except FileNotFoundError:
        return "missing"
    return NOT_ATTEMPTED if regions.not_attempted(text, shipped_text(ex)) else "attempted"


def reset(name: str, force: bool = False):
    """Write labs/exercises/<name>.cu as shipped. A file with the learner's work in it is kept
    first, byte for byte, as <name>.cu.bak1 (then .bak2, ...: never over an earlier copy), and
    only with force=True is it replaced. Returns the path (files.backups(path)[-1] is the copy
    a reset of an attempted file made)."""
    ex = get(name)
    path = ex.learner_file
    if path.is_file() and status(name) == "attempted":
        if not force:
            raise FileExistsError(f"{path} holds your work; reset(..., force=True) replaces it "
                                  f"(a copy is kept first, as {path.name}.bak1 or the next "
                                  "free number)")
        files.backup(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(shipped_text(ex))
    return path


def solution(name: str) -> str:
    """The lines a learner writes, step by step, as the solution has them (the kernel in
    kernels/, or labs/solutions/checkpoint.py)."""
    ex = get(name)
    if scratch.is_scratch(ex):
        return scratch.solution(ex)
    if ex is checkpoint_ex.CHECKPOINT:
        where, source = "labs/solutions/checkpoint.py", ex.solution_file.read_text()
    else:
        where, source = f"kernels/{ex.kernel}", (device.KERNELS_DIR / ex.kernel).read_text()
    out = [f"exercise {name}: the solution is {where}; the lines you write:"]
    for step, title, lines in regions.solution_lines(source, name):
        out.append(f"\nstep {step}: {title}")
        out += lines
    return "\n".join(out)
