"""Every name and path a lab notebook tells its reader about exists: dotted names in the
markdown's code spans and in code comments (`ckptlab.measure.traffic`, `table.NAIVE_TILE`,
`reference.tiled_forward`) resolve against the package, and repository paths
(`ckptlab/measure/roofline.py`, `kernels/attn_naive_fwd.cu`) exist. Static: nothing is executed,
modules are only imported, so this runs in the default test run.

A dotted name is checked when its head is `ckptlab`, a name the notebook imports, or the last
part of a ckptlab module's name (`attention.x` when a module `attention` exists or existed: a
reader would type it). Other heads are notebook variables (`r.flops`), whose type is known only
by running the notebook."""

import ast
import importlib
import importlib.util
import pkgutil
import re
from pathlib import Path

import pytest

import ckptlab

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (requirements-dev)")

ROOT = Path(__file__).resolve().parent.parent
LABS = ROOT / "labs"
NOTEBOOKS = sorted([*LABS.glob("[0-9][0-9]_*.ipynb"), *LABS.glob("A[0-9]_*.ipynb")])
DOTTED = re.compile(r"(?<![\w./-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w/-])")
PATH = re.compile(r"(?<![\w./*-])((?:[\w*-]+/)+[\w.*-]*|[\w*-]+\.(?:py|cu|cuh|ipynb|md|toml))"
                  r"(?![\w/*-])")
FILE_SUFFIXES = (".py", ".cu", ".cuh", ".ipynb", ".md", ".toml", ".h", ".cpp", ".txt", ".sh")
try:  # a finder that refuses the name (tests/test_gpu_collection.py hides packages so) raises
    HAVE_TORCH = importlib.util.find_spec("torch") is not None
except ImportError:
    HAVE_TORCH = False
# Heads that are modules by their last name: every ckptlab module, with the old top-level
# module `attention` (now ckptlab.kernels) so a stale mention of it is still caught.
MODULE_NAMES = {m.name.rsplit(".", 1)[-1] for m in
                pkgutil.walk_packages(ckptlab.__path__, "ckptlab.")} | {"attention"}


def texts(nb):
    """(where, text) of every markdown cell (its prose and code spans) and every code comment."""
    for k, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            yield f"cell {k} markdown", cell.source
        elif cell.cell_type == "code":
            for line in cell.source.splitlines():
                if "#" in line:
                    yield f"cell {k} comment", line.split("#", 1)[1]


def imports(nb) -> dict:
    """{name: object} for every name the notebook's import lines bind (`%` magics dropped)."""
    code = "\n".join(line for c in nb.cells if c.cell_type == "code"
                     for line in c.source.splitlines() if not line.lstrip().startswith(("%", "!")))
    bound = {"ckptlab": ckptlab}
    for node in ast.walk(ast.parse(code)):
        try:
            bind(node, bound)
        except ImportError:  # PyTorch absent: names under it go unchecked
            pass
    return bound


def bind(node, bound: dict) -> None:
    """Adds the names one import statement binds to `bound`."""
    if isinstance(node, ast.Import):
        for a in node.names:
            mod = importlib.import_module(a.name)
            bound[a.asname or a.name.split(".")[0]] = mod if a.asname else \
                importlib.import_module(a.name.split(".")[0])
    elif isinstance(node, ast.ImportFrom) and node.module:
        mod = importlib.import_module(node.module)
        for a in node.names:
            obj = getattr(mod, a.name, None)
            if obj is None:
                obj = importlib.import_module(f"{node.module}.{a.name}")
            bound[a.asname or a.name] = obj


def resolve(obj, parts) -> bool:
    for part in parts:
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        name = getattr(obj, "__name__", None)
        try:  # a submodule not imported by its package
            obj = importlib.import_module(f"{name}.{part}")
        except (ImportError, TypeError):
            return False
    return True


def modules_named(last: str) -> list:
    found = []
    for m in pkgutil.walk_packages(ckptlab.__path__, "ckptlab."):
        if m.name.rsplit(".", 1)[-1] == last:
            try:
                found.append(importlib.import_module(m.name))
            except ImportError:  # needs PyTorch
                pass
    return found


def stale_names(nb) -> list:
    bound = imports(nb)
    bad = []
    for where, text in texts(nb):
        text = PATH.sub(" ", text)  # `labs/solutions/01_roofline.py` is a path, not a name
        for name in DOTTED.findall(text):
            head, *rest = name.split(".")
            if not HAVE_TORCH and "torch" in (head, *rest[:1]):  # checked where it is installed
                continue
            if head in bound:
                ok = resolve(bound[head], rest)
            elif head in MODULE_NAMES:  # the reader would type it: not imported is stale too
                ok = False
                hint = [m.__name__ for m in modules_named(head) if resolve(m, rest)]
                name = f"{name} (not imported here{'; it is ' + hint[0] if hint else ''})"
            else:
                continue
            if not ok:
                bad.append(f"{where}: {name}")
    return bad


def stale_paths(nb) -> list:
    bad = []
    for where, text in texts(nb):
        for path in PATH.findall(text):
            path = path.rstrip(".")
            if not path.endswith((*FILE_SUFFIXES, "/")):  # FLOP/s, dL/dS: units and math
                continue
            if "/" in path:
                ok = any(any(base.glob(path.rstrip("/"))) for base in (ROOT, LABS))
            else:  # a bare file name: somewhere in the repository's own folders
                ok = any(ROOT.glob(f"[!.]*/**/{path}")) or (ROOT / path).exists()
            if not ok:
                bad.append(f"{where}: {path}")
    return bad


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_dotted_names_resolve(path):
    bad = stale_names(nbformat.read(path, as_version=4))
    assert not bad, f"{path.name} names what does not exist: {bad}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_repository_paths_exist(path):
    bad = stale_paths(nbformat.read(path, as_version=4))
    assert not bad, f"{path.name} cites paths that do not exist: {bad}"


def test_the_scan_catches_a_stale_name_and_path():
    """The checks can fail: a renamed function, an unimported module and a moved file."""
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("from ckptlab import reference\nx = 1  # see reference.rel_err"),
        nbformat.v4.new_markdown_cell("Uses `reference.flash_forward`, `attention.NAIVE_TILE`, "
                                      "`ckptlab.measure.nothing` and `ckptlab/roofline.py`; "
                                      "`ckptlab.kernels.table.NAIVE_TILE` and "
                                      "`ckptlab/measure/roofline.py` exist."),
    ])
    names = " ".join(stale_names(nb))
    assert "reference.flash_forward" in names and "attention.NAIVE_TILE" in names
    assert "ckptlab.measure.nothing" in names and "rel_err" not in names
    assert "table.NAIVE_TILE" not in names.replace("attention.NAIVE_TILE", "")
    assert [p.split(": ")[1] for p in stale_paths(nb)] == ["ckptlab/roofline.py"]
