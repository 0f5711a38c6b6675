"""The second list of learner mistakes (tests/kernel_mistakes_fresh.py), held to what the check
gives them: every one is caught, the wrong output is named, and where the check names the
cause's class the row says which; where it does not, the row holds what it says instead
(marked "class not named"), so that a change in either direction shows."""

from __future__ import annotations

import pytest
from kernel_mistakes_fresh import MISTAKES
from test_kernel_exercises import _plant

from ckptlab.exercises.write import hints

# rows whose class the check does not name: the pattern it gives instead (class not named)
SAID = {
    1: "global_race",   # class not named: the head's offset, told as a race between blocks
    2: "global_race",   # class not named: the head's offset, told as a race between blocks
    4: "nan",           # class not named: the rescale across tiles, told as NaN everywhere
    5: "zero",          # class not named: an accumulator never set, told as O all 0
    8: "everywhere",    # class not named: dP from the wrong tile
    12: None,           # class not named: it does not build (the compiler's error at the line)
    13: "race",         # class not named: the store's leading dimension, told as a race
    14: "zero",         # class not named: the rescale across columns, told as y all 0
}


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
    else:
        assert report.pattern == SAID[i], text


def test_the_rows_with_no_class_are_the_ones_said():
    assert {i for i, m in enumerate(MISTAKES) if m[5] is None} == set(SAID)
