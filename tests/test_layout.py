"""The package's architecture holds: no import cycle between ckptlab's modules, no import that
runs upward against the layer order ckptlab.LAYERS documents, no module over 400 lines, and
every document the project points at is in the repository.

Imports are read from the source (ast), wherever they are written: at the top, inside a
function, or under `if TYPE_CHECKING`. A lazy import is still a dependency."""

import ast
import re
from pathlib import Path

import pytest

import ckptlab

ROOT = Path(ckptlab.__file__).resolve().parent
REPO = ROOT.parent
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict:
    """{module name: path} of every .py file under ckptlab/."""
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports_of(path: Path, name: str, known: set) -> set:
    """The ckptlab modules `path` imports (a `from pkg import sub` names the submodule)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # ckptlab.emu.build.EmuError -> ckptlab.emu.build
                t = t.rpartition(".")[0]
            if t.startswith("ckptlab") and t != name:
                out.add(t)
    return out


def graph() -> dict:
    mods = modules()
    known = set(mods)
    return {name: imports_of(path, name, known) for name, path in mods.items()}


def layer_of(name: str) -> int:
    """Index in ckptlab.LAYERS of the package or module `name` belongs to."""
    top = name.split(".")[1] if "." in name else None
    for k, members in enumerate(ckptlab.LAYERS):
        if top in members:
            return k
    raise AssertionError(f"{name} is in no layer of ckptlab.LAYERS: add it there")


def test_every_module_has_a_layer():
    for name in modules():
        if name != "ckptlab":
            layer_of(name)


def test_no_import_runs_upward():
    bad = [f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)})"
           for a, deps in graph().items() if a != "ckptlab"
           for b in deps if b != "ckptlab" and layer_of(b) > layer_of(a)]
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def find_cycle(g: dict):
    """One cycle of the graph as a list of modules, or None (depth-first search)."""
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(g.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(g):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_no_import_cycles():
    g = graph()
    # a package's __init__ may import its own submodules; a submodule importing the package
    # itself is then a cycle, and is reported
    cycle = find_cycle(g)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_find_cycle_finds_one():
    """The checker itself: a planted cycle is found, an acyclic graph passes."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_upward_import_is_caught(tmp_path):
    """The checker itself: an import written inside a function still counts."""
    f = tmp_path / "m.py"
    f.write_text("def g():\n    from ckptlab.cli import tour\n")
    assert imports_of(f, "ckptlab.kernels.m", {"ckptlab.cli.tour", "ckptlab.cli"}) == {
        "ckptlab.cli.tour"}


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.py")) + sorted(ROOT.rglob("*.cpp"))
                         + sorted(ROOT.rglob("*.h")) + sorted((REPO / "kernels").glob("*.cu*"))
                         + sorted((REPO / "tests").glob("*.py")),
                         ids=lambda p: str(p.relative_to(REPO)))
def test_files_stay_readable(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(REPO)} has {n} lines (at most {MAX_LINES})"


DOC = re.compile(r"(?<![\w/.-])((?:\.\./)*[\w./-]*[A-Za-z_][\w-]*\.md)\b")


def test_documents_referred_to_are_in_the_repository():
    """Code, comments, notebooks and docs point only at documents the repository carries."""
    files = [*ROOT.rglob("*.py"), *(REPO / "kernels").glob("*"), *(REPO / "labs").rglob("*"),
             *(REPO / "tests").glob("*.py"), *(REPO / "docs").glob("*.md"), REPO / "README.md",
             *(REPO / "bench").glob("*")]
    have = {p.name for p in REPO.rglob("*.md") if ".venv" not in p.parts}
    missing = []
    for f in files:
        if not f.is_file() or f.suffix not in (".py", ".cu", ".cuh", ".ipynb", ".md", ".sh"):
            continue
        for ref in DOC.findall(f.read_text()):
            found = (REPO / ref).is_file() or (f.parent / ref).is_file() if "/" in ref else (
                ref in have)
            if ref.startswith("../") or not found:  # nothing outside the repository
                missing.append(f"{f.relative_to(REPO)}: {ref}")
    assert not missing, "references to documents not in the repository:\n" + "\n".join(missing)
