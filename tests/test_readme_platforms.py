"""The README says what runs where, and what it says of the code holds: the emulator is built by
g++ with GCC's hooks (so macOS's clang and native Windows cannot build it), it has a portable
fiber switch besides the x86-64 one, and the GPU arch table starts at sm_75."""

import re
from pathlib import Path

from ckptlab.emu import build
from ckptlab.kernels import archs

ROOT = Path(__file__).resolve().parent.parent


def section(text: str, title: str) -> str:
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_the_readme_says_what_runs_where():
    where = section((ROOT / "README.md").read_text(), "What runs where")
    for place in ("Linux x86-64", "Linux aarch64", "Windows: WSL2", "Colab, Kaggle: CPU runtime",
                  "Colab, Kaggle: GPU runtime", "Docker", "macOS", "Windows, native"):
        assert re.search(rf"^\| {re.escape(place)}", where, flags=re.M), place
    mac = next(line for line in where.splitlines() if line.startswith("| macOS"))
    assert "no:" in mac and "clang" in mac and "Docker" in mac


def test_what_the_readme_says_of_the_code_holds():
    assert "-fsanitize=thread" in Path(build.__file__).read_text()  # GCC's hooks, as it says
    scheduler = (ROOT / "ckptlab/emu/scheduler.cpp").read_text()
    assert "defined(__x86_64__)" in scheduler and "swapcontext" in scheduler  # both switches
    assert min(archs.ARCHS, key=lambda a: int(a[3:])) == "sm_75"
    assert "sm_60" not in archs.ARCHS
