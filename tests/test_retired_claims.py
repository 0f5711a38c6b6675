"""Sentences the model once contradicted stay out of what the reader sees: every lab (its
markdown and code), every doc, the README and the package's docstrings and messages are
searched for each. Each entry says what the model says instead, and where that is checked."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

RETIRED = [
    (r"only tensor parallelism over a whole node",
     "published 175B runs split the layers into pipeline stages (t 8 x p 8 or p 16): "
     "test_cli_plan's GPT-3 on 1024 A100s"),
    (r"GPT-3 was trained with t\s*=\s*8",
     "Brown et al. publish no layout; t = 8 is Korthikanti et al.'s run"),
    (r"peak is an upper bound",
     "with more than one micro-batch a step holds all of it at once: "
     "test_torch_peak_accumulation"),
    (r"from this N on[^.]*cannot fall below",
     "past s_exceeds_l2_from's N up to the L2's size of S still hits"),
    (r"bracket holds for timed runs",
     "past s_exceeds_l2_from's N up to the L2's size of S still hits"),
    (r"atomicAdd[^.]*counted as one store",
     "the model counts an atomicAdd as a read and a write: test_timemodel"),
    (r"ties torch\.compile",
     "the budget bench compares saved and peak bytes, FLOPs and replay time, "
     "ckptlab planned first: test_torch_budget_planner"),
    (r"within 25% on 22 of 24",
     "model-check fits on named lengths and reports its held-out misses: test_model_check"),
    (r"1\.027 for all four",
     "Korthikanti's four models give 1.053, 1.027, 1.018, 1.012: test_at_scale"),
]


def reader_texts():
    """(where, text) for every lab cell, doc, README and package source file."""
    for nb in sorted((ROOT / "labs").glob("*.ipynb")):
        for k, cell in enumerate(json.loads(nb.read_text())["cells"]):
            yield f"{nb.name} cell {k}", "".join(cell["source"])
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        yield md.name, md.read_text()
    for src in sorted([*(ROOT / "ckptlab").rglob("*.py"), *(ROOT / "labs").rglob("*.py"),
                       *(ROOT / "bench").glob("*.py")]):
        yield str(src.relative_to(ROOT)), src.read_text()


TEXTS = list(reader_texts())


def test_the_search_sees_the_labs_docs_and_package():
    names = {w.split(" cell")[0] for w, _ in TEXTS}
    assert "README.md" in names and any(n.endswith(".ipynb") for n in names)
    assert any(n.startswith("ckptlab/measure/") for n in names)


@pytest.mark.parametrize("pattern, instead", RETIRED, ids=[p for p, _ in RETIRED])
def test_a_retired_claim_is_nowhere(pattern, instead):
    rx = re.compile(pattern, re.IGNORECASE)
    # a sentence spread over lines still matches: whitespace runs read as one space
    found = [where for where, text in TEXTS if rx.search(re.sub(r"\s+", " ", text))]
    assert not found, f"{pattern!r} in {found}: the model says {instead}"
