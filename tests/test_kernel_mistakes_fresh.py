"""The second and third lists of learner mistakes (tests/kernel_mistakes_fresh.py, _third.py),
held to what the check gives them: every one is caught, the wrong output is named, and where the
check names the cause's class the row says which; where it does not, the row holds what it says
instead (marked "class not named"), so that a change in either direction shows."""

from __future__ import annotations

import pytest
from kernel_mistakes_fresh import MISTAKES
from kernel_mistakes_third import MISTAKES as THIRD
from test_kernel_exercises import _plant

from ckptlab.exercises.write import hints

# rows whose class the check does not name: the pattern it gives instead (class not named)
SAID = {
    12: None,  # class not named: it does not build (the compiler's error at the line)
}
# how the report names the class where only its hint does: the hint's words
BY_HINT = {4: "first value", 9: "the mask", 13: "leading dimension", 14: "first value",
           15: "merge"}
THIRD_BY_HINT = {1: "applied twice", 2: "per-row quantity", 3: "thread should own",
                 5: "guard", 7: "merge"}


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(MISTAKES)), ids=[f"{m[0]}-{i}" for i, m in
                                                          enumerate(MISTAKES)])
def test_a_fresh_mistake_gets_what_the_check_gives(i, tmp_path):
    name, old, new, status, output, key, _ = MISTAKES[i]
    report = _plant(name, old, new, tmp_path)
    text = str(report)
    assert report.status == status, text
    if output is not None:
        assert text.startswith(f"wrong: {name}: {output} "), text
    if key is not None:
        assert key in (report.pattern, hints.family(report.pattern)), text
        if i in BY_HINT:
            hint = next(ln for ln in text.splitlines() if ln.startswith("hint 1: "))
            assert BY_HINT[i] in hint, text
    else:
        assert report.pattern == SAID[i], text


def test_the_rows_with_no_class_are_the_ones_said():
    assert {i for i, m in enumerate(MISTAKES) if m[5] is None} == set(SAID)


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(THIRD)), ids=[f"{m[0]}-{i}" for i, m in enumerate(THIRD)])
def test_a_mistake_of_the_third_list_gets_what_the_check_gives(i, tmp_path):
    name, old, new, status, output, key, _ = THIRD[i]
    report = _plant(name, old, new, tmp_path)
    text = str(report)
    assert report.status == status, text
    if output is not None:
        assert text.startswith(f"wrong: {name}: {output} "), text
    assert key in (report.pattern, hints.family(report.pattern)), text
    if i in THIRD_BY_HINT:
        hint = next(ln for ln in text.splitlines() if ln.startswith("hint 1: "))
        assert THIRD_BY_HINT[i] in hint, text
