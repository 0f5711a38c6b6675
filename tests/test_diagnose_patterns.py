"""The element patterns of a wrong output (ckptlab.exercises.write.diagnose), on arrays small
enough to see by eye: which rows or heads are wrong, whether the output is off by one factor
or by a factor a row, zero, NaN or never written, and which case the finding is named for.
No kernel runs here: each Failure is the truth with a planted difference."""

import numpy as np

from ckptlab.exercises.write.diagnose import Failure, _factor, _ranges, diagnose, locate, mismatch
from ckptlab.exercises.write.spec import Case, Output

BASE = Case("base", "the base case", {"Nq": 10, "d": 4})
O = Output("O", ("i", "c"), {"i": 4})  # rows i in tiles of 4


def truth(rows=10, cols=3):
    """A float64 truth with no zero element: 1, 2, 3, ..."""
    return np.arange(1.0, rows * cols + 1).reshape(rows, cols)


def failure(x, r, output=O, case=BASE, unwritten=None):
    return Failure(case, output, x, r, mismatch(x, r, 1e-4), unwritten)


def wrong_rows(rows, n=10, cols=3, output=O):
    r = truth(n, cols)
    x = r.copy()
    x[list(rows)] += 0.5  # a small error, not a factor of the row
    x[list(rows), 0] += 1.0
    return failure(x, r, output)


def test_rows_in_the_last_partial_tile_are_the_tail():
    # 10 rows in tiles of 4: tiles 0..3, 4..7 and the partial 8..9; row 8 alone is in it
    assert locate(wrong_rows([8]))[0] == "tail_i"
    assert locate(wrong_rows([8, 9]))[0] == "tail_i"


def test_rows_past_the_first_tile_when_the_tiles_divide():
    # 8 rows, tiles of 4 (no partial tile): rows 4..7 are everything past the first tile
    pattern, where = locate(wrong_rows(range(4, 8), n=8))
    assert pattern == "after_first_tile_i", where
    assert "i = 4..7 (of 0..7)" in where and "first tile of i (4) is right" in where


def test_the_first_tile_alone_and_one_row_past_it():
    assert locate(wrong_rows(range(0, 4), n=8))[0] == "first_tile_i"
    # rows 0..4 reach into the second tile: not the first tile's fault alone
    assert locate(wrong_rows(range(0, 5), n=8))[0] == "part_i"


def test_heads_after_the_first():
    out = Output("O", ("bh", "i"), {})
    r = truth(3, 5)
    x = r.copy()
    x[1:, 2] += 1.0  # heads 1 and 2 wrong at one row each, head 0 right
    pattern, where = locate(failure(x, r, out))
    assert pattern == "heads" and "bh = 1..2 (of 0..2)" in where


def test_one_factor_everywhere_is_named():
    r = truth()
    for c, name in ((2.0, "= 2"), (0.5, "= 1/2"), (-1.0, "= -1 (the sign)"),
                    (0.3, None)):  # 0.3 is no factor a slip is known for: no name
        pattern, where = locate(failure(c * r, r))
        assert pattern == "factor", where
        if name:
            assert where.endswith(name), where
        else:
            assert where.endswith("factor, 0.3"), where
    # d = 4: the softmax scale 1 / sqrt(4) = 1/2 is tried after the plain 1/2, which names it
    assert locate(failure(2.0 * r, r))[1].endswith("= 2")


def test_rows_of_zeros_and_rows_off_by_their_own_factor():
    r = truth()
    x = r.copy()
    x[[2, 5]] = 0.0  # two rows all 0, the others right
    pattern, where = locate(failure(x, r))
    assert pattern == "zero" and "2 rows are all 0" in where and "row (2,)" in where
    x = r.copy()
    x[2] *= 3.0
    x[5] *= 7.0  # two rows, each by its own factor
    pattern, where = locate(failure(x, r))
    assert pattern == "row_factor" and "from 3 to 7" in where, where
    assert locate(failure(np.zeros_like(r), r)) == ("zero", "every element is 0")


def test_nan_where_float64_is_finite_but_not_where_both_are_infinite():
    r = truth()
    x = r.copy()
    x[3, 1] = np.nan
    pattern, where = locate(failure(x, r))
    assert pattern == "nan" and where.startswith("1 of 30 elements are NaN"), where
    # a masked element: -inf in both (right), and one finite element wrong elsewhere
    r[0, 0] = x[0, 0] = -np.inf
    x[3, 1] = r[3, 1] + 1.0
    assert locate(failure(x, r))[0] != "nan"


def test_never_written_elements_come_first_even_when_only_some_are():
    r = truth()
    x = r.copy()
    x[9, :2] = np.nan  # two elements left as the NaN poison
    unwritten = np.zeros_like(r, bool)
    unwritten[9, :2] = True
    pattern, where = locate(failure(x, r, unwritten=unwritten))
    assert pattern == "unwritten", where
    assert where.startswith("2 of 30 elements were never written") and "O(9, 0)" in where


def test_equal_infinities_match_and_nan_never_does():
    r = np.array([-np.inf, np.inf, 1.0, 2.0])
    assert not mismatch(r.copy(), r, 1e-4).any()
    x = r.copy()
    x[0], x[2] = np.inf, np.nan
    assert mismatch(x, r, 1e-4).tolist() == [True, False, True, False]


def test_ranges_join_runs_and_keep_four_parts():
    assert _ranges([0, 1, 2, 5, 7, 8]) == "0..2, 5, 7..8"
    assert _ranges([0, 2, 4, 6]) == "0, 2, 4, 6"
    assert _ranges([0, 2, 4, 6, 8]) == "0, 2, 4, 6, ..."


def test_a_ratio_that_is_not_finite_is_no_factor():
    r = truth()
    x = 2.0 * r
    x[4, 1] = np.inf
    assert _factor(failure(x, r)) is None


def test_right_with_one_tile_wrong_with_several_but_nan_stays_nan():
    one = Case("one_tile", "a single tile", {"Nq": 4, "d": 4})
    r = truth()
    x = r.copy()
    x[5, 0] = np.nan
    f = failure(x, r)
    found = diagnose([f], [BASE, one], [O])
    assert found.pattern == "nan", found.where
    assert found.where.startswith("O is right with a single tile (Nq=4, d=4) and wrong")
    # the same wrong element, finite: the pattern is the case's, "multi_tile"
    x[5, 0] = r[5, 0] + 1.0
    assert diagnose([failure(x, r)], [BASE, one], [O]).pattern == "multi_tile"
