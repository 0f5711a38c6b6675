"""Every figure a lab notebook makes is shown. A cell that calls a plotting function
(`plot_*`, `Figure(`) must leave the figure where Jupyter displays it: the cell's last
expression, an argument of display(), or a name that is one of those. A figure returned inside
an if/else or a loop is made and never seen. Static (no execution): the executed notebooks'
image/png outputs are checked by tests/test_notebooks.py's slow run."""

import ast
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (requirements-dev)")

LABS = Path(__file__).resolve().parent.parent / "labs"
NOTEBOOKS = sorted([*LABS.glob("[0-9][0-9]_*.ipynb"), *LABS.glob("A[0-9]_*.ipynb")])
PLOTTING = re.compile(r"(?<![\w.])(?:\w+\.)*(plot_\w+|Figure)\(")


def makes_figure(node) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
    return name == "Figure" or name.startswith("plot_")


def shown_names(tree) -> set:
    """Names Jupyter displays: the cell's last expression and display()'s arguments."""
    names = set()
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1].value
        if isinstance(last, ast.Name):
            names.add(last.id)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "display":
            names |= {a.id for a in node.args if isinstance(a, ast.Name)}
    return names


def unshown_figures(source: str) -> list:
    """The line numbers of the figure-making calls in `source` whose figure is never shown."""
    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                     for line in source.splitlines())
    tree = ast.parse(code)
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            child.parent = parent
    names = shown_names(tree)
    last = tree.body[-1].value if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    bad = []
    for node in ast.walk(tree):
        if not makes_figure(node):
            continue
        while isinstance(node.parent, ast.IfExp):  # `a if c else b` shows whichever it picks
            node = node.parent
        up = node.parent
        if node is last:
            continue
        if isinstance(up, ast.Call) and getattr(up.func, "id", "") == "display":
            continue
        if isinstance(up, ast.Assign) and all(isinstance(t, ast.Name) and t.id in names
                                              for t in up.targets):
            continue
        bad.append(node.lineno)
    return bad


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_figure_is_shown(path):
    nb = nbformat.read(path, as_version=4)
    bad = [f"cell {k} line {line}" for k, c in enumerate(nb.cells) if c.cell_type == "code"
           for line in unshown_figures(c.source)]
    assert not bad, f"{path.name} makes figures it never shows: {bad}"


def test_the_check_can_fail():
    """Lab 06's old cell: the figure returned inside an if/else is never displayed."""
    assert unshown_figures("if a:\n    plots.plot_time_vs_n(n, s)\nelse:\n"
                           "    plots.plot_time_vs_n(n, s, title='t')\n") == [2, 4]
    assert unshown_figures("fig = plots.plot_x(1)\nx = 2\n") == [1]
    assert unshown_figures("plots.plot_x(1)\nprint(2)\n") == [1]
    assert unshown_figures("%matplotlib inline\nfig = Figure()\nax = fig.subplots()\nfig") == []
    assert unshown_figures("if a:\n    display(plots.plot_x(1))\nplots.plot_y(2)") == []
    assert unshown_figures("f = plots.plot_x(1) if a else plots.plot_x(2)\nf") == []
