"""The guided exercises say what each step computes and why, never the line: no step note, no
hint (either grade, an exercise's own or hints.GENERIC, checkpoint's too), no code a learner's
file gives outside its steps (a sibling kernel holding a step with its names changed), and no
notebook cell above an exercise holds a line of a solution, compared by shape
(tests/step_shapes.py says how, and which lines are too short or too generic to compare)."""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import re

import pytest
from step_shapes import holds, leaks, parts

from ckptlab import device
from ckptlab.exercises import write
from ckptlab.exercises.write import checkpoint_ex, hints, regions
from ckptlab.exercises.write.spec import LABS_DIR, StepText

NAMES = list(write.EXERCISES)


def solution(name: str) -> list[tuple[str, str, str]]:
    """(where, line, comment mark) of every line exercise `name`'s steps hold."""
    ex = write.get(name)
    if ex is checkpoint_ex.CHECKPOINT:
        source, mark = ex.solution_file.read_text(), "#"
    else:
        source, mark = (device.KERNELS_DIR / ex.kernel).read_text(), "//"
    return [(f"{name} step {step}", line, mark)
            for step, _, lines in regions.solution_lines(source, name) for line in lines]


EVERY_LINE = [entry for name in NAMES for entry in solution(name)]


def notes_of(name: str) -> dict[int, tuple]:
    ex = write.get(name)
    if ex is checkpoint_ex.CHECKPOINT:
        return checkpoint_ex.NOTES
    return {n: s.notes for n, s in ex.steps.items()}


def hints_of(name: str) -> dict:
    ex = write.get(name)
    return checkpoint_ex.HINTS if ex is checkpoint_ex.CHECKPOINT else ex.hints


@pytest.mark.parametrize("name", NAMES)
def test_no_step_note_holds_a_solution_line(name):
    """Each step's note, its lines joined (a line wrapped over two comment lines is still
    found), against every exercise's solution lines."""
    bad = [f"step {n}: {leak}" for n, notes in notes_of(name).items()
           for leak in leaks(" ".join(notes), EVERY_LINE)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", NAMES)
def test_no_hint_of_an_exercise_holds_a_solution_line(name):
    bad = [f"hint {key!r} grade {g + 1}: {leak}" for key, pair in hints_of(name).items()
           for g, text in enumerate(pair) for leak in leaks(text, EVERY_LINE)]
    assert not bad, "\n".join(bad)


def test_no_generic_hint_holds_a_solution_line():
    bad = [f"GENERIC[{key!r}] grade {g + 1}: {leak}" for key, pair in hints.GENERIC.items()
           for g, text in enumerate(pair) for leak in leaks(text, EVERY_LINE)]
    assert not bad, "\n".join(bad)


def given_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of a learner's file outside its YOUR CODE blocks."""
    inside = {n for s in regions.steps(text) for n in range(s.begin, s.end + 1)}
    return [(n, line) for n, line in enumerate(text.splitlines(), start=1) if n not in inside]


@pytest.mark.parametrize("name", NAMES)
def test_no_given_code_of_a_learners_file_holds_one_of_its_steps(name):
    """What the shipped file gives around the steps (a sibling kernel, a helper) holds no
    line of the exercise's own steps, even with its names changed."""
    ex = write.get(name)
    text = write.shipped_text(ex)
    mine = solution(name)
    bad = [f"{ex.learner_file.name}:{n}: {line.strip()!r} holds {leak}"
           for n, line in given_lines(text) for leak in leaks(line, mine)]
    assert not bad, "\n".join(bad)


def test_the_comparison_can_fail():
    """A step's line with every name changed is found, in prose or in a sibling's code; the
    mathematics a note states is not; nor are the file's loops and index declarations."""
    line = "const float z = p > 0.0f ? dropout_factor(drop, (bh * Nq + i) * Nk + j) : 0.0f;"
    entry = [("x step 1", line, "//")]
    assert leaks("Step 1: zz = dropout_factor(d, (b * N + r) * M + c), the forward's", entry)
    assert not leaks("z = Z_ij / (1 - p), or 0 where P_ij = 0 (masked: no word drawn)", entry)
    dq = [("x step 2", "dSs[ii][y] = p * (dpd * z - Ds[ii]);  // dS_ij = P_ij (dP_ij - D_i)",
           "//")]
    assert leaks("dSs[r][jj] = p * (dpd * z - Ds[r]);", dq)
    assert leaks("then dS[i][j] = pp * (dq * zz - D[i])", dq)
    assert not leaks("dS_ij = P_ij (dP_ij - D_i)", dq)
    assert not leaks("const long long e = (bh * Nk + j) * d + col;", entry)
    assert leaks("run fn under `with tape.no_grad():`", [("c", "with tape.no_grad():  # x", "#")])
    assert parts("for (int c = 0; c < Dt / LANES; ++c) {") == []
    assert parts("const int col = lane + c * LANES;") == []
    assert parts("float sv = 0.0f, sk = 0.0f;") == []
    assert parts("float* p = P + row * Nk;") == []
    assert holds("wmma::mma_sync(d, a, b, c) computes", parts("wmma::mma_sync(acc, a, b, acc);")[0])


@pytest.mark.parametrize("name", NAMES)
def test_no_step_text_is_a_bare_string(name):
    """A StepText's notes and placeholder are tuples of lines: a bare string would be shipped
    one character a line."""
    ex = write.get(name)
    fields = ([("NOTES", checkpoint_ex.NOTES), ("PLACEHOLDERS", checkpoint_ex.PLACEHOLDERS)]
              if ex is checkpoint_ex.CHECKPOINT else
              [(f"step {n}", vars(s)) for n, s in ex.steps.items()])
    for where, held in fields:
        for key, value in held.items():
            assert isinstance(value, tuple) and all(isinstance(v, str) for v in value), (
                f"{name} {where} {key}: {value!r} is not a tuple of lines")
    if ex is not checkpoint_ex.CHECKPOINT:
        assert all(isinstance(s, StepText) for s in ex.steps.values())
        assert isinstance(ex.intro, tuple)


# ---------------------------------------------------------------- the notebooks, cell by cell

LABS = sorted(LABS_DIR.glob("0*.ipynb"))
WRITES = re.compile(r"write_kernel\(\"(\w+)\"")


namespace: dict = {"device": device}


def printed(cell) -> str:
    """What a cell shows of a kernel file: its statements that need nothing but `device` (and
    what they assign) run on their own; '' for a cell that reads no kernel file."""
    if cell.cell_type != "code" or "device.kernel_" not in cell.source:
        return ""
    known, out = {"device"} | set(dir(builtins)), io.StringIO()
    for stmt in ast.parse(cell.source).body:
        used = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)}
        bound = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)
                 and isinstance(n.ctx, ast.Store)}
        if used - bound <= known:
            with contextlib.redirect_stdout(out):
                exec(compile(ast.Module([stmt], []), "<cell>", "exec"), namespace)  # noqa: S102
            known |= bound
    return out.getvalue()


def shown_above(path) -> list[tuple[str, int, str, str]]:
    """(exercise, cell, where, text) of every markdown line, code line and printed kernel line
    above each exercise a learner writes in notebook `path`."""
    nbformat = pytest.importorskip("nbformat")  # a test dependency; the GPU machine lacks it
    nb = nbformat.read(path, as_version=4)
    out = []
    for k, cell in enumerate(nb.cells):
        m = WRITES.search(cell.source) if cell.cell_type == "code" else None
        if not m:
            continue
        for j, above in enumerate(nb.cells[:k]):
            for line in above.source.splitlines():
                out.append((m.group(1), j, above.cell_type, line))
            for line in printed(above).splitlines():
                out.append((m.group(1), j, "output", line))
    return out


@pytest.mark.parametrize("path", LABS, ids=[p.name[:2] for p in LABS])
def test_no_notebook_cell_above_an_exercise_shows_its_lines(path):
    bad = [f"{path.name} cell {j} ({where}) above exercise {name}: {line.strip()!r} holds "
           f"{leak}" for name, j, where, line in shown_above(path)
           for leak in leaks(line, solution(name))]
    assert not bad, "\n".join(bad)
