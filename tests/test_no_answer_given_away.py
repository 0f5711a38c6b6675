"""No exercise's answer is given away: not printed or written anywhere a learner reads before
the exercise's own cell, nor in the message a wrong answer gets.

The right answer of each exercise (tests/exercise_cases.py: the worked solution, which the
checker accepts) is written in the forms a learner would type: every rounding to 1-6
significant digits or 0-3 decimals, with thousands separators, as a percentage, in KiB ... GiB,
kB ... GB and MFLOP ... TFLOP; a form counts only if the checker itself says "right" to the value
it reads as (so "0.42" is a form of 5/12, and "0.4" is not). Small whole numbers (a tile size, a
head dim, a number of segments) are in every shape a lab prints, so they are looked for with the
symbol the exercise names (`k = 16`, `d = 128`). A layout (t, p) is looked for as the labs
write one (`t = 8, p = 4`, the plan's `t=8 +SP p=4 v=2 d=4`, `t 8 x p 4`, `(8, 4)`, and for
p = 1 the plan's `t=8 +SP d=16`), for every (t, p) the checker accepts. Some exercises can be
given away by their computation too (the rule's value 2 R / 3, a formula): those strings are
listed per exercise.

- Messages (default suite): each checker is probed with the usual slips (factors of 2, 4, 8, 1/8,
  100, 1024, off by one, and each exercise's own) and no wrong answer's message may hold a form.
- Notebooks (`-m notebooks`): each notebook is run once; no markdown cell and no output before
  an exercise's cell may hold a form of its answer.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from exercise_cases import CASES, S10

from ckptlab.recompute.checkpoint import Seg

UNITS = [(2**10, "KiB"), (2**20, "MiB"), (2**30, "GiB"), (2**40, "TiB"), (1e3, "kB"),
         (1e6, "MB"), (1e9, "GB"), (1e12, "TB"), (1e6, "MFLOP"), (1e9, "GFLOP"), (1e12, "TFLOP"),
         (1e6, "M"), (1e9, "G")]
SMALL = 1000  # whole answers below this are looked for with their symbol only
SYMBOLS = {  # case id -> the symbol the exercise asks for, for small whole answers
    "compute_bound_tile": "T", "flash_tile_rows": "Br", "crossing_d": "d",
    "least_memory_segments": "k", "traffic_exponent": "p", "revolve_one_snapshot": "forwards",
}
# Strings that hand over the computation rather than the number, per exercise (checked in
# messages and, for the notebooks, before the exercise): code, a formula, or a number from which
# the answer is one step away (the rule's value 2 R / 3 for the crossing, the least peak's bytes).
COMPUTATIONS = {
    "online_merge": [r"np\.where\(", r"l_a \* np\.exp", r"rescale by exp"],
    "softmax_backward": [r"P \* \(dP - D\)", r"P_ij \(dP_ij - D_i\)", r"subtract D"],
    "deterministic_flops_ratio": [r"\b10 d\b", r"\b14 d\b", r"8 d in dkdv", r"\(6 d\)"],
    "tp_bytes_per_gpu": [r"10 \+ 24 ?/ ?t", r"5 a s / \(h t\)"],
    "sgemm_bytes": [r"ceil\(N ?/ ?16\) times", r"ceil\(M ?/ ?16\) times"],
}


def _rule_values(case) -> list[str]:
    from ckptlab.measure import crossing

    gpu, dtype = case.kwargs["gpu"], case.kwargs["dtype"]
    rules = (crossing.rule_of_thumb(gpu, dtype), crossing.rule_of_thumb(gpu, dtype, overlap=True))
    return [rf"(?<![\w.]){v:.{k}f}(?!\.?\d)" for v in rules for k in (0, 1)]


def _least_peak(case) -> list[str]:
    from ckptlab.recompute import schedules

    prof = case.kwargs["prof"]
    least = min(schedules.uniform(prof.n_blocks, k).predict(prof).peak_bytes
                for k in range(1, prof.n_blocks + 1))
    return [rf"(?<![\w.,]){least}(?!\d)", rf"(?<![\w.,]){least:,}(?![\d,])"]


COMPUTED = {"crossing_d": _rule_values, "least_memory_segments": _least_peak}


def _numbers(x: float) -> set[str]:
    out = {repr(float(x))}  # a float printed in full
    for sig in range(1, 7):
        s = f"{x:.{sig}g}"
        if "e" not in s:
            out.add(s)
    for dec in range(4):
        out.add(f"{x:.{dec}f}")
    if float(x).is_integer():
        out |= {str(int(x)), f"{int(x):,}", f"{int(x):_}"}
    return out


def candidates(x: float) -> dict[str, float]:
    """{the string a learner might write: the value it reads as} for an answer near x."""
    out = {s: float(s.replace(",", "").replace("_", "")) for s in _numbers(x)}
    for scale, unit in UNITS:
        if abs(x) / scale >= 1:
            for s in _numbers(x / scale):
                value = float(s.replace(",", "").replace("_", "")) * scale
                out[f"{s} {unit}"] = value
                out[f"{s}{unit}"] = value
    if 0 < x < 1:
        for dec in range(3):
            out[f"{100 * x:.{dec}f}%"] = float(f"{100 * x:.{dec}f}") / 100
            out[f"{100 * x:.{dec}f} %"] = float(f"{100 * x:.{dec}f}") / 100
    return out


def layout_forms(t: int, p: int) -> list[str]:
    """Regular expressions of a layout (t, p) as the labs and the plan write one."""
    end = r"(?![\w]|[.,]\d)"  # the number ends there: "p = 8." is 8, "p = 8.5" and "p = 80" are not
    out = [rf"\bt\s*=\s*{t}{end}[^\n]{{0,40}}?\bp\s*=\s*{p}{end}",
           rf"\bt\s*=?\s*{t}\s*[x×]\s*p\s*=?\s*{p}{end}", rf"\(\s*{t}\s*,\s*{p}\s*\)"]
    if p == 1:  # the plan prints no p without a pipeline
        out.append(rf"\bt={t}(?: \+SP)? d=")
    return out


def accepted_layouts(case) -> list[tuple[int, int]]:
    """Every (t, p) the checker says "right" to: t a power of two up to 16, p a divisor of the
    layers (several layouts can be within the checker's tolerance of the fastest)."""
    layers = case.kwargs["model"].layers
    return [(t, p) for t in (1, 2, 4, 8, 16) for p in range(1, layers + 1)
            if layers % p == 0 and case.checker((t, p), **case.kwargs) == "right"]


def forms(case) -> list[str]:
    """Regular expressions of the right answer in every form the checker accepts."""
    x = case.right
    if isinstance(x, tuple) and len(x) == 2 and all(isinstance(v, int) for v in x):
        return [f for t, p in accepted_layouts(case) for f in layout_forms(t, p)]
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer,
                                                            np.floating)):
        return []
    accepted = [s for s, v in candidates(float(x)).items()
                if case.checker(v, **case.kwargs) == "right"]
    if float(x).is_integer() and abs(x) < SMALL:
        sym = SYMBOLS.get(case.id)
        if sym is None:
            return []
        n = int(x)
        return [rf"\b{sym}\s*=\s*{n}(?![\d.])", rf"(?<![\w.]){n} (?:block )?{sym}\b"]
    return [rf"(?<![\w.,]){re.escape(s)}(?![\w]|[.,]\d)" for s in accepted]


def found(patterns, text: str) -> list[str]:
    return [m.group(0) for p in patterns for m in [re.search(p, text)] if m]


# ---------------------------------------------------------------- the messages of wrong answers

FACTORS = (0.5, 2, 0.25, 4, 0.125, 8, 1 / 16, 16, 0.01, 100, 1 / 1024, 1024, 1e-3, 1e3, 1.5,
           2 / 3, 0.9, 1.1)


def _unguarded(m_a, l_a, m_b, l_b):
    m = np.maximum(m_a, m_b)
    return m, l_a * np.exp(m_a - m) + l_b * np.exp(m_b - m)


# Slips that are not a factor away: functions, plans, and each checker's own usual slips.
OWN_SLIPS = {
    "softmax_backward": [lambda P, dP: P * dP,
                         lambda P, dP: dP - (P * dP).sum(axis=1, keepdims=True),
                         lambda P, dP: P * dP - P, lambda P, dP: None],
    "online_merge": [_unguarded, lambda m_a, l_a, m_b, l_b: (np.maximum(m_a, m_b), l_a + l_b),
                     lambda m_a, l_a, m_b, l_b: (m_b, l_a * np.exp(m_a - m_b) + l_b),
                     lambda m_a, l_a, m_b, l_b: (np.zeros_like(m_a),
                                                 l_a * np.exp(m_a) + l_b * np.exp(m_b))],
    "sgemm_bytes": [4 * (40 * 56 + 56 * 24 + 40 * 24)],
    "sgemm_shared_bytes": [2048, 4096, 2 * 32 * 32],
    "crossing_d": [16, 32, 64, 96, "never"],
    "least_memory_segments": list(range(1, 33)),
    "schedule_for_budget": ["sqrt", "every(2)", "every(4)", "revolve(2)", "keep(matmul)",
                            "recompute(attn)", [Seg([0, 1, 2, 3]), 4, 5, 6, 7]],
    "recompute_flops": [1_280_000 // 2, 1_280_000 // 3],
    "revolve_one_snapshot": [100, 55, 90, 10],
    "traffic_exponent": [1, 3, 4],
    "compute_bound_tile": [16, 32, 38, 40, 64],
    "flash_tile_rows": [48, 64, 50, 8],
    "choose_layout": [(8, 16), (8, 4), (8, 2), (8, 1), (4, 8), (4, 16), (4, 1), (2, 16), (1, 1),
                      (1, 32), (16, 1), (3, 1), (8, 32), (8, 5), "8,8", (8,), {"t": 8}],
}


def slips(case) -> list:
    out = list(OWN_SLIPS.get(case.id, []))
    x = case.right
    if isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool):
        out += [x * f for f in FACTORS]
        if float(x).is_integer():
            out += [x - 1, x + 1]
    out.append(case.wrong)
    return out


def giveaways(case) -> list[str]:
    extra = COMPUTED[case.id](case) if case.id in COMPUTED else []
    return forms(case) + COMPUTATIONS.get(case.id, []) + extra


def leaks_in_messages(case) -> list[str]:
    bad, patterns = [], giveaways(case)
    for slip in slips(case):
        with np.errstate(all="ignore"):
            verdict = case.checker(slip, **case.kwargs)
        if verdict == "right" or verdict == "not answered yet":
            continue
        hits = found(patterns, verdict)
        if hits:
            bad.append(f"{slip!r} -> {verdict!r}: holds {hits}")
    return bad


MESSAGE_CASES = [pytest.param(c, id=f"{c.lab}-{c.id}") for c in CASES if c.exercise]


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # a slip's own
@pytest.mark.parametrize("case", MESSAGE_CASES)
def test_no_wrong_answer_is_told_the_answer(case):
    bad = leaks_in_messages(case)
    assert not bad, f"{len(bad)} messages give the answer away, e.g.\n" + "\n".join(bad[:3])


def test_the_forms_are_the_ones_a_learner_writes():
    """The scan can fail: 5/12 is found as 0.417 and 0.42 (not as 0.4: off by 4%), 2^32 bytes
    as 4294967296, 4,294,967,296 and 4 GiB, 80,960 and 80960, 70.2% and 70% (the checker's 1%)."""
    by = {(c.lab, c.id): c for c in CASES}
    intensity = forms(by["01", "softmax_intensity"])
    assert found(intensity, "I = 0.417 FLOP/byte") and found(intensity, "about 0.42")
    assert not found(intensity, "0.4 FLOP/byte") and not found(intensity, "10.42")
    saved = forms(by["02", "naive_saved_bytes"])
    for text in ("4294967296 bytes", "4,294,967,296", "4 GiB", "4.0 GiB", "4096 MiB"):
        assert found(saved, text), text
    assert not found(saved, "4.19 GB/s") and not found(saved, "14 GiB")
    wmma = forms(by["07", "wmma_gemm_bytes"])
    assert found(wmma, "modeled 80,960 B") and found(wmma, "80960")
    share = forms(by["11", "selective_saving"])
    assert found(share, "saves 70.2%") and found(share, "about 70%") and found(share, "0.702")
    segments = forms(by["09", "least_memory_segments"])
    assert found(segments, "at k = 16 segments") and not found(segments, "(16, 32)")
    assert leaks_in_messages(by["10", "schedule_for_budget"]) == []
    layout = forms(by["14", "choose_layout"])  # (8, 8) and (8, 16), within the model's error
    for text in ("t=8 +SP p=8 v=4 d=2 ZeRO-1", "ran at t = 8, p = 8.", "(8, 8)", "t 8 x p 8"):
        assert found(layout, text), text
    for text in ("t=8 +SP p=4 v=3 d=1", "t = 8, p = 8.5", "p = 8 stages", "t=8 +SP d=16 FSDP"):
        assert not found(layout, text), text
    assert S10.answer_1  # the plan the DP finds too


# ---------------------------------------------------------------- the notebooks, run once

def exercise_cells(nb, lab: str) -> list[tuple[int, object]]:
    """(cell index, case) of each exercise's checker call in the notebook."""
    cases = {c.checker.__name__: c for c in CASES if c.lab == lab and c.exercise}
    out = []
    for k, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        m = re.search(r"^exercise\.(\w+)\(", cell.source, flags=re.M)
        if m and m.group(1) in cases:
            out.append((k, cases[m.group(1)]))
    return out


def shown_before(nb, k: int) -> list[tuple[str, str]]:
    """(where, text) of every markdown cell and code output before cell k."""
    out = []
    for j, cell in enumerate(nb.cells[:k]):
        if cell.cell_type == "markdown":
            out.append((f"cell {j} markdown", cell.source))
        else:
            for o in cell.get("outputs", []):
                text = o.get("text", "") + o.get("data", {}).get("text/plain", "")
                if text:
                    out.append((f"cell {j} output", text))
    return out


def leaks_in_notebook(nb, lab: str) -> list[str]:
    bad = []
    for k, case in exercise_cells(nb, lab):
        patterns = giveaways(case)
        if case.id == "schedule_for_budget":  # the DP's plan, printed, is an answer too
            patterns = patterns + [re.escape(str(S10.answer_1))]
        for where, text in shown_before(nb, k):
            hits = found(patterns, text)
            if hits:
                bad.append(f"exercise {case.exercise} ({case.id}, cell {k}): {where} shows "
                           f"{hits}")
    return bad


def _notebooks():
    from test_notebooks import RUNNABLE
    return RUNNABLE


@pytest.mark.notebooks
@pytest.mark.parametrize("path", _notebooks())
def test_no_answer_is_shown_above_its_exercise(path, monkeypatch):
    import nbformat
    from test_notebooks import execute

    nb = nbformat.read(path, as_version=4)
    execute(nb, monkeypatch)
    bad = leaks_in_notebook(nb, path.name[:2])
    assert not bad, "\n".join(bad)


def test_the_notebook_scan_can_fail():
    """A notebook that prints the answer above the exercise, and one that writes it in the
    prompt, are both caught; the same text after the exercise is not."""
    import nbformat

    v4 = nbformat.v4
    printed = v4.new_code_cell("print(5 / 12)", outputs=[
        v4.new_output("stream", name="stdout", text="0.4166666666666667\n")])
    prompt = v4.new_markdown_cell("**Exercise 2.** The intensity (about 0.42 FLOP/byte)?")
    ask = v4.new_code_cell("answer_2 = ...\nexercise.softmax_intensity(answer_2, R=4096, "
                           "C=4096)")
    after = v4.new_markdown_cell("It is 0.417 FLOP/byte.")
    bad = leaks_in_notebook(v4.new_notebook(cells=[printed, prompt, ask, after]), "01")
    assert [b.split(": ", 1)[1].split(" shows")[0] for b in bad] == ["cell 0 output",
                                                                      "cell 1 markdown"]
