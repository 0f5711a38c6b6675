"""Every lab notebook (labs/*.ipynb) runs top to bottom on the CPU, on the emulator, without an
error and in under 60 seconds of wall time (the budget for a 2-core machine), executed by
nbclient in a fresh kernel, and every cell that makes a figure shows one (an image/png output).
The stored files must carry no outputs or execution counts, and each notebook must pose at
least two exercises with a checker. With the worked solutions
(labs/solutions/) pasted into the exercise cells, every checker in the notebook says "right"."""

import ast
import importlib.util
import os
import re
import time
from pathlib import Path

import pytest

# Optional packages (requirements-dev.txt): a machine without them, such as the lent GPU machine,
# skips this file with the reason instead of failing the whole collection of `pytest -m gpu`.
nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (requirements-dev)")

LABS = Path(__file__).resolve().parent.parent / "labs"
MAIN_LINE = sorted(LABS.glob("[0-9][0-9]_*.ipynb"))
APPENDICES = sorted(LABS.glob("A[0-9]_*.ipynb"))  # off the main line: A1, ...
NOTEBOOKS = MAIN_LINE + APPENDICES
BUDGET_S = 60.0
PLOTTING = re.compile(r"(?<![\w.])(?:\w+\.)*(plot_\w+|Figure|subplots)\(")


def test_the_labs_are_numbered_and_listed():
    """Labs 01-14 and the appendix A1, one notebook per number, each with a line in the
    README's table and in labs/README.md's."""
    numbers = [p.name[:2] for p in NOTEBOOKS]
    assert len(set(numbers)) == len(numbers), NOTEBOOKS
    assert [p.name[:2] for p in MAIN_LINE] == [f"{i:02d}" for i in range(1, 15)], MAIN_LINE
    assert [p.name[:2] for p in APPENDICES] == ["A1"], APPENDICES
    for readme in (LABS.parent / "README.md", LABS / "README.md"):
        text = readme.read_text()
        missing = [p.name for p in NOTEBOOKS if f"| `{p.name}` |" not in text]
        assert not missing, f"{readme.name} has no table line for {missing}"


def checker_module(path) -> str:
    """The notebook's checkers: ckptlab.exercises.lab01 for 01_*.ipynb, appendix_a1 for A1_*."""
    tag = path.name[:2]
    return f"lab{tag}" if tag.isdigit() else f"appendix_{tag.lower()}"


def needs_torch(path) -> list:
    """The notebook's marks: skipped, with the reason, if it imports PyTorch and it is missing."""
    code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells
                     if c.cell_type == "code")
    if not re.search(r"^\s*(import torch|from ckptlab\.torch|from ckptlab import torch)", code,
                     flags=re.M):
        return []
    try:  # a finder that refuses the name (tests/test_gpu_collection.py hides packages so) raises
        missing = importlib.util.find_spec("torch") is None
    except ImportError:
        missing = True
    if missing:
        return [pytest.mark.torch, pytest.mark.skip(reason=f"{path.name} runs PyTorch, which "
                                                    "is not installed: pip install -e '.[torch]'")]
    return [pytest.mark.torch]


RUNNABLE = [pytest.param(p, marks=needs_torch(p), id=p.stem) for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for k, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"cell {k} has outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_has_two_checked_exercises(path):
    code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells
                     if c.cell_type == "code")
    assert f"from ckptlab.exercises import {checker_module(path)} as exercise" in code
    assert len(set(re.findall(r"\bexercise\.(\w+)\(", code))) >= 2
    assert "labs.solutions" not in code and "solutions/" not in code  # never the answers


def execute(nb, monkeypatch) -> float:
    """Run `nb` in a fresh kernel on the emulator; returns the wall seconds (kernel start
    included). Raises CellExecutionError, naming the cell, on any error."""
    NotebookClient = pytest.importorskip("nbclient").NotebookClient  # noqa: N806

    monkeypatch.setenv("CKPTLAB_DEVICE", "emu")  # the kernel inherits it: CPU even on a GPU box
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    client = NotebookClient(nb, timeout=2 * int(BUDGET_S), kernel_name="python3",
                            resources={"metadata": {"path": str(LABS)}})
    t0 = time.perf_counter()
    client.execute()
    return time.perf_counter() - t0


@pytest.mark.notebooks
@pytest.mark.parametrize("path", RUNNABLE)
def test_runs_on_the_cpu_within_budget(path, monkeypatch):
    nb = nbformat.read(path, as_version=4)
    seconds = execute(nb, monkeypatch)
    print(f"{path.name}: {seconds:.1f} s on {os.cpu_count()} CPUs")
    assert seconds < BUDGET_S, f"{path.name} took {seconds:.1f} s (budget {BUDGET_S:.0f} s)"
    assert not figures_missing(nb), f"{path.name}: no figure shown by {figures_missing(nb)}"


def always_plots(stmts) -> bool:
    """Whether one of `stmts` calls a plotting function whatever the branches taken: in a plain
    statement or a `with`, or in both arms of an if/else (a figure drawn only on a GPU, or in
    a loop that may not run, is not required)."""
    for st in stmts:
        if isinstance(st, ast.If):
            if always_plots(st.body) and always_plots(st.orelse):
                return True
        elif isinstance(st, ast.With):
            if always_plots(st.body):
                return True
        elif not isinstance(st, (ast.For, ast.While, ast.Try, ast.FunctionDef)) and \
                PLOTTING.search(ast.unparse(st)):
            return True
    return False


def figures_missing(nb) -> list:
    """The executed cells that always make a figure but show no image/png."""
    def plots_always(source: str) -> bool:
        code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                         for line in source.splitlines())
        return always_plots(ast.parse(code).body)

    return [f"cell {k}" for k, c in enumerate(nb.cells)
            if c.cell_type == "code" and plots_always(c.source)
            and not any("image/png" in o.get("data", {}) for o in c.outputs)]


def test_a_figure_never_shown_is_missing():
    """figures_missing can fail: a plotting cell without an image output is reported."""
    shown = nbformat.v4.new_code_cell("plots.plot_time_vs_n(n, s)", outputs=[
        nbformat.v4.new_output("display_data", data={"image/png": "", "text/plain": "<Fig>"})])
    unseen = nbformat.v4.new_code_cell("if a:\n    f = plots.plot_time_vs_n(n, s)\nelse:\n"
                                       "    f = plots.plot_time_vs_n(n, s, title='t')")
    text = nbformat.v4.new_code_cell("print(1)")
    gpu_only = nbformat.v4.new_code_cell("if ON_GPU:\n    display(plots.plot_time_vs_n(n, s))")
    plain = nbformat.v4.new_code_cell("%matplotlib inline\nfig = Figure()\nx = 1")
    nb = nbformat.v4.new_notebook(cells=[shown, unseen, text, gpu_only, plain])
    assert figures_missing(nb) == ["cell 1", "cell 4"]


@pytest.mark.notebooks
@pytest.mark.parametrize("path", RUNNABLE)
def test_worked_solutions_are_right_in_the_notebook(path, monkeypatch):
    """`answer_k = ...` becomes `answer_k = SOL.answer_k` and a function whose body is
    `return ...` becomes the solution's function, SOL being labs/solutions/<stem>.py."""
    nb = nbformat.read(path, as_version=4)
    load = (f"import importlib.util\nspec = importlib.util.spec_from_file_location('sol', "
            f"{str(LABS / 'solutions' / (path.stem + '.py'))!r})\n"
            "SOL = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(SOL)")
    checked = []
    for k, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        src = re.sub(r"^(answer_\d+) = \.\.\.$", r"\1 = SOL.\1", cell.source, flags=re.M)
        cell.source = re.sub(r"^def (\w+)\(.*\):\n    return \.\.\..*$", r"\1 = SOL.\1", src,
                             flags=re.M)
        if re.search(r"^exercise\.\w+\(", cell.source, flags=re.M):
            checked.append(k)
    assert len(checked) >= 2, "expected at least two checked exercises"
    nb.cells.insert(1, nbformat.v4.new_code_cell(load))
    execute(nb, monkeypatch)
    for k in checked:
        shown = "".join(o.get("data", {}).get("text/plain", "") + o.get("text", "")
                        for o in nb.cells[k + 1].outputs)
        # a checker says "right" (a kernel's check then reports its bytes on the lines after)
        verdict = shown.strip().splitlines()[0] if shown.strip() else ""
        assert verdict == "right", f"cell {k}: {nb.cells[k + 1].source!r} -> {shown!r}"


SECTIONS = [r"Motivation", r".+", r"Check", r"Measure|Count", r"What it means"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_sections_in_the_labs_order(path):
    """Every lab's numbered sections open with motivation, the kernel (or the idea), check it,
    measure it, what it means, in that order (a lab may add sections after them)."""
    heads = [m.group(1) for c in nbformat.read(path, as_version=4).cells
             if c.cell_type == "markdown"
             for m in re.finditer(r"^## \d+\. (.+)$", c.source, flags=re.M)]
    assert len(heads) >= len(SECTIONS), heads
    for want, got in zip(SECTIONS, heads, strict=False):
        assert re.match(want, got), f"{path.name}: expected a section like {want!r}, got {got!r}"
