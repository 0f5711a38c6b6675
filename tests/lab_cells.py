"""A lab notebook's cells run in this process, one at a time, in a namespace of the test's
making: to force what a notebook cannot be given from outside (a GPU's name, its free memory,
CUDA being there) and look at what one cell then makes. Not a test file."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import nbformat

LABS = Path(__file__).resolve().parent.parent / "labs"


def code_cell(lab: str, first_line: str) -> str:
    """The source of the code cell of labs/<lab>_*.ipynb whose first line starts with
    `first_line` (its opening comment); magics and shell lines dropped."""
    (path,) = LABS.glob(f"{lab}_*.ipynb")
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "code" and cell.source.startswith(first_line):
            return "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                             for line in cell.source.splitlines())
    raise LookupError(f"{path.name} has no code cell starting with {first_line!r}")


def run(source: str, namespace: dict) -> str:
    """Execute `source` in `namespace` (updated in place); returns what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, "<lab cell>", "exec"), namespace)  # noqa: S102 - the lab's own code
    return out.getvalue()
