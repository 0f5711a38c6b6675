"""Every lab notebook (labs/*.ipynb) runs top to bottom on the CPU, on the emulator, without an
error and in under 60 seconds of wall time (the issue's budget for a 2-core machine), executed
by nbclient in a fresh kernel. The stored files must carry no outputs or execution counts, and
each notebook must pose at least two exercises with a checker."""

import os
import re
import time
from pathlib import Path

import nbformat
import pytest

LABS = Path(__file__).resolve().parent.parent / "labs"
NOTEBOOKS = sorted(LABS.glob("[0-9][0-9]_*.ipynb"))
BUDGET_S = 60.0


def test_all_eight_labs_are_there():
    assert [p.name[:2] for p in NOTEBOOKS] == [f"{i:02d}" for i in range(1, 9)], NOTEBOOKS


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
    assert "import exercises as check" in code
    assert len(set(re.findall(r"\bcheck\.(\w+)\(", code))) >= 2
    assert "labs.solutions" not in code and "solutions/" not in code  # never the answers


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_runs_on_the_cpu_within_budget(path, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("CKPTLAB_DEVICE", "emu")  # the kernel inherits it: CPU even on a GPU box
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=2 * int(BUDGET_S), kernel_name="python3",
                            resources={"metadata": {"path": str(LABS)}})
    t0 = time.perf_counter()
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    seconds = time.perf_counter() - t0
    print(f"{path.name}: {seconds:.1f} s on {os.cpu_count()} CPUs")
    assert seconds < BUDGET_S, f"{path.name} took {seconds:.1f} s (budget {BUDGET_S:.0f} s)"
