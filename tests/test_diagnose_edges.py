"""Edges of the element patterns (diagnose.py, classes.py) on small planted arrays: an output
wrong everywhere is "everywhere", not a part of an axis; one wrong element is no "factor
everywhere"; NaN beside inf is said as both; the poison of locals is named; a few NaN among
many wrong elements in a case of large scores still name the missing max; and the rank that
decides which output's finding leads."""

import numpy as np
from test_diagnose_patterns import failure, truth, wrong_rows

from ckptlab.emu.build import POISON_FLOAT
from ckptlab.exercises.write import classes
from ckptlab.exercises.write.diagnose import locate, rank_of
from ckptlab.exercises.write.spec import Case


def test_an_output_wrong_in_every_element_is_everywhere():
    pattern, where = locate(wrong_rows(range(10)))
    assert pattern == "everywhere" and "30 of 30" in where, where


def test_one_wrong_element_is_no_factor_everywhere():
    r = np.zeros((10, 3))
    r[3, 1] = 5.0
    x = r.copy()
    x[3, 1] = 10.0  # the only nonzero element, doubled
    pattern, where = locate(failure(x, r))
    assert pattern != "factor" and "everywhere" not in where, where


def test_nan_beside_inf_is_said_as_both():
    r = truth()
    x = r.copy()
    x[2, 1], x[5, 0] = np.inf, np.nan
    pattern, where = locate(failure(x, r))
    assert pattern == "nan" and "NaN or inf" in where, where
    x[2, 1] = np.nan
    assert "are NaN where" in locate(failure(x, r))[1]


def test_the_poison_of_locals_is_named_uninitialised():
    r = truth()
    x = r.copy()
    x[2, 1] = POISON_FLOAT
    assert classes.uninitialised(failure(x, r))[0] == "uninit"
    assert locate(failure(x, r))[0] == "uninit"


def test_a_few_nan_among_many_wrong_name_the_missing_max_in_a_large_case():
    """15 wrong elements, 2 of them NaN (more than a tenth), in a case of large scores."""
    large = Case("large", "large scores", {"Nq": 10, "d": 4})
    r = truth()
    x = r.copy()
    x[:5] += 0.5
    x[0, :2] = np.nan
    f = failure(x, r, case=large)
    assert classes.blow_up(f)[0] == "no_max"
    x[0, 1] = 1.0 + 0.5  # one NaN of 15: no longer the class's sign
    assert classes.blow_up(failure(x, r, case=large)) is None


def test_the_rank_puts_wrong_everywhere_last_and_a_slip_first():
    order = [rank_of("x", alternative=True), rank_of("uninit"), rank_of("part_i", by_case=True),
             rank_of("multi_tile"), rank_of("part_i"), rank_of("everywhere")]
    assert order == sorted(order, reverse=True) and len(set(order)) == len(order), order
