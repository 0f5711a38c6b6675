"""A table of the labs (labs/*.ipynb), one line a notebook, from running each top to bottom:

    ideas     the `## ` sections that teach something: every section but the template's frame
              (Motivation..., What it means..., the Write-it-yourself / Edit-a-kernel exercise
              sections, and a bare "Check it", "Check them", "Measure it" or "Count them"; a
              check or measure section with its own subject after a colon counts)
    text kB   the text outputs once run: stream text and text/plain (1 kB = 1000 bytes of UTF-8)
    images    outputs that carry an image (their data is not counted above)
    leaks     the exercises whose answer is shown above them (the JSON lists every place), by
              tests/test_no_answer_given_away.py's detector; a checker called in the notebook is
              matched to tests/exercise_cases.py by its name and its literal keyword arguments,
              so older notebooks, numbered otherwise, are scanned too, against this checkout's
              cases and checkers (an exercise no case matches is listed as such)
    cold s    the wall time of the run, kernel start included, with the emulator's cache
              (CKPTLAB_CACHE_DIR) a new folder: the runtime and every kernel compiled first
    warm s    the same notebook again on that cache

Each notebook runs as tests/test_notebooks.py runs it: nbclient, a fresh python3 kernel from
this interpreter, CKPTLAB_DEVICE=emu, the inline plotting backend, the labs folder as the working
directory. --root runs the labs of another checkout (its labs/ folder, its ckptlab first on the
kernel's PYTHONPATH; the kernel's ckptlab.__file__ is checked to be that checkout's). The machine's
load average is printed beside each line: a shared machine is slower.

    python bench/lab_table.py [--root DIR] [--only 01,07] [--no-cold] [--json FILE]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FRAME = re.compile(r"^(?:\d+\.\s*)?(?:Motivation\b.*|What it means\b.*|.*\byourself\b.*|"
                   r"(?:Check it|Check them|Measure it|Count them)\s*)$")
PROBE = "import ckptlab as _c; print(_c.__file__)"


def sections(nb) -> list[str]:
    return [m.group(1).strip() for c in nb.cells if c.cell_type == "markdown"
            for m in re.finditer(r"^## (.+)$", c.source, flags=re.M)]


def ideas(nb) -> list[str]:
    return [s for s in sections(nb) if not FRAME.match(s)]


def outputs(nb) -> tuple[int, int, int]:
    """(bytes of stream text and text/plain, images, bytes of other text such as text/html)."""
    text = images = other = 0
    for c in nb.cells:
        for o in c.get("outputs", []) if c.cell_type == "code" else []:
            text += len(o.get("text", "").encode())
            for mime, value in o.get("data", {}).items():
                if mime.startswith("image/"):
                    images += 1
                elif mime == "text/plain":
                    text += len(value.encode())
                elif mime.startswith("text/"):
                    other += len(value.encode())
    return text, images, other


def execute(nb, labs: Path, env: dict) -> float:
    from nbclient import NotebookClient

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        client = NotebookClient(nb, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": str(labs)}})
        t0 = time.perf_counter()
        client.execute()
        return time.perf_counter() - t0
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(path: Path, root: Path, cache: str) -> tuple[object, float]:
    """The notebook run once (a probe cell appended, checked, then removed) and its seconds."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    env = {"CKPTLAB_DEVICE": "emu", "MPLBACKEND": "module://matplotlib_inline.backend_inline",
           "CKPTLAB_CACHE_DIR": cache,
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(
               os.pathsep)}
    seconds = execute(nb, path.parent, env)
    probe = nb.cells.pop()
    where = "".join(o.get("text", "") for o in probe.outputs).strip()
    if not Path(where).resolve().is_relative_to(root.resolve()):
        from ckptlab.args import UsageError

        raise UsageError(f"{path.name}: the kernel imported ckptlab from {where}, not {root}")
    return nb, seconds


def _literal_kwargs(call: ast.Call) -> dict:
    out = {}
    for kw in call.keywords:
        try:
            out[kw.arg] = ast.literal_eval(kw.value)
        except ValueError:
            out[kw.arg] = None  # not a literal (a profile, a call): not compared
    return out


def leaks(nb) -> tuple[list[str], list[str]]:
    """(the answers shown above their exercise, the exercises no case matches)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import test_no_answer_given_away as scan
    from exercise_cases import CASES, S10

    found, unmatched = [], []
    number = 0
    for k, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        code = "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln
                         for ln in cell.source.splitlines())
        for st in ast.parse(code).body:  # `exercise.NAME(...)` statements, a line or several
            call = st.value if isinstance(st, ast.Expr) else None
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and isinstance(call.func.value, ast.Name) and call.func.value.id == "exercise"):
                continue
            number += 1
            name, kwargs = call.func.attr, _literal_kwargs(call)
            cases = [c for c in CASES if c.exercise and c.checker.__name__ == name and all(
                v is None or c.kwargs.get(key) == v for key, v in kwargs.items())]
            if name == "schedule_for_budget" and len(cases) > 1:  # lab 10's chain or lab 12's
                torch = "torch" in "\n".join(c.source for c in nb.cells)
                cases = [c for c in cases if ("torch" in c.id) == torch]
            if not any(c.checker.__name__ == name for c in CASES):  # a kernel to write
                unmatched.append(f"exercise {number} ({name}): no case (no answer to look for)")
                continue
            if len(cases) != 1:
                unmatched.append(f"exercise {number} ({name}): {len(cases)} cases match")
                continue
            case = cases[0]
            patterns = scan.giveaways(case)
            if case.id == "schedule_for_budget":
                patterns = patterns + [re.escape(str(S10.answer_1))]
            for where, text in scan.shown_before(nb, k):
                hits = scan.found(patterns, text)
                if hits:
                    found.append(f"exercise {number} ({name}): {where} shows {hits}")
    return found, unmatched


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=ROOT, help="a checkout whose labs/ to run")
    p.add_argument("--only", default="", help="comma-separated lab tags (01, A1)")
    p.add_argument("--no-cold", action="store_true", help="one run on a shared cache, no cold")
    p.add_argument("--json", type=Path, help="also write the rows (with the leaks) here")
    a = p.parse_args(argv)
    from ckptlab.args import UsageError
    from ckptlab.cli.report import writable_file

    if a.json:
        writable_file(a.json)  # a path that cannot be written stops here, before any run
    root = a.root.resolve()
    paths = sorted((root / "labs").glob("[0-9A][0-9]_*.ipynb"))
    if a.only:
        paths = [q for q in paths if q.name[:2] in a.only.split(",")]
    if not paths:
        raise UsageError(f"no notebooks in {root / 'labs'}" + (f" tagged {a.only}" * bool(a.only)))
    rows = []
    print(f"{'lab':<34}{'ideas':>6}{'text kB':>9}{'images':>7}{'leaks':>6}{'cold s':>8}"
          f"{'warm s':>8}{'load':>6}", flush=True)
    with tempfile.TemporaryDirectory() as shared:
        for path in paths:
            with tempfile.TemporaryDirectory() as fresh:
                cold = None
                if not a.no_cold:
                    _, cold = run(path, root, fresh)
                nb, warm = run(path, root, shared if a.no_cold else fresh)
            text, images, other = outputs(nb)
            bad, unmatched = leaks(nb)
            if root == ROOT:  # this checkout's own test, by the lab's tag, as a cross-check
                import test_no_answer_given_away as scan
                if len(scan.leaks_in_notebook(nb, path.name[:2])) != len(bad):
                    unmatched.append("the test's own scan finds another count")
            row = dict(lab=path.name, ideas=ideas(nb), sections=sections(nb), text_bytes=text,
                       other_text_bytes=other, images=images, leaks=bad, unmatched=unmatched,
                       cold_s=cold, warm_s=warm, load=os.getloadavg()[0])
            rows.append(row)
            c = f"{cold:8.1f}" if cold is not None else f"{'-':>8}"
            leaked = len({b.split(" (")[0] for b in bad})
            print(f"{path.name:<34}{len(row['ideas']):>6}{text / 1000:>9.1f}{images:>7}"
                  f"{leaked:>6}{c}{warm:>8.1f}{row['load']:>6.2f}", flush=True)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    from ckptlab.args import exit_with  # one line for a write error; quiet into | head

    exit_with(main)
