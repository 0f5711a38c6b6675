"""Every file a kernel's comments name (`ckptlab/....py`, `kernels/...`, `tests/...`) exists in
the repository: a header that cites a moved module sends its reader nowhere."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CITED = re.compile(r"\b((?:ckptlab|kernels|tests|bench)/[\w/.-]+\.(?:py|cu|cuh|h))\b")


def test_every_path_a_kernel_cites_exists():
    missing = [f"{path.name}: {ref}" for path in sorted((ROOT / "kernels").glob("*.cu*"))
               for ref in CITED.findall(path.read_text()) if not (ROOT / ref).exists()]
    assert not missing, missing
