"""The kernel exercise checks are as wide as the learner's file: every instantiation the
wrappers can launch from it runs (stored beside flash, the deterministic dQ beside the atomic
one, tf32 beside the 16-bit types), on scores far from 0 in both directions, so that kernels
that are right only where the narrower check looked are not told "right"."""

from __future__ import annotations

import numpy as np
import pytest

from ckptlab import device
from ckptlab.exercises import write
from ckptlab.exercises.write import flash_cases, hints, regions
from ckptlab.exercises.write.check import FAULT, WRONG
from ckptlab.exercises.write.class_hints import hints_of


def solved(name: str) -> str:
    ex = write.get(name)
    return regions.fill(write.shipped_text(ex), (device.KERNELS_DIR / ex.kernel).read_text(),
                        name)


def plant(name, old, new, tmp_path):
    text = solved(name)
    assert old in text, f"{name}: the planted line is not in the solution: {old!r}"
    path = tmp_path / f"{name}.cu"
    path.write_text(text.replace(old, new, 1))
    return write.check(name, file=path)


# Each was "right" when the check ran one instantiation on scores of moderate size.
# (exercise, the solution's text, the learner's, status, output named, pattern or fault kinds,
#  the case the report must name)
ONCE_RIGHT = [
    # no query bound in `seen`: rows past Nq write S out of bounds in the stored instantiation
    ("flash_forward", "const bool seen = visible(i, j, Nq, Nk, causal);",
     "const bool seen = j < Nk && (!causal || j <= i + Nk - Nq);", FAULT, None,
     ("access", "global_race"), "stored+"),
    # a leading dimension of 16: As is 16 x 8 in the tf32 instantiation
    ("wmma_tile", "wmma::load_matrix_sync(a, &As[0][0], KT);",
     "wmma::load_matrix_sync(a, &As[0][0], 16);", FAULT, None, ("access",), "tf32"),
    # the running max started at 0: every term underflows when every score is below -104
    # (the class: no max subtracted, from the elements; or the case that alone fails)
    ("flash_forward", "float m = -INFINITY, l = 0.0f;", "float m = 0.0f, l = 0.0f;", WRONG, "O",
     ("no_max", "negative"), "negative"),
]


@pytest.mark.counted
@pytest.mark.parametrize("name,old,new,status,output,patterns,case", ONCE_RIGHT,
                         ids=["seen_without_i_lt_Nq", "wmma_ld_16", "max_from_0"])
def test_a_kernel_once_told_right_is_caught(name, old, new, status, output, patterns, case,
                                            tmp_path):
    report = plant(name, old, new, tmp_path)
    text = str(report)
    assert report.status == status, text
    assert report.pattern in patterns, text
    if status == FAULT:
        assert text.splitlines()[0].startswith(f"fault: {name}, in case {case}"), text
        assert "every case ran clean in the default instantiation; this one is " in text, text
    else:
        assert report.finding.output == output and report.finding.case.label == case, text


@pytest.mark.counted
@pytest.mark.parametrize("name,old,new,output,pattern", [
    # S stored unscaled: O and L are right, the scores the backward reads are not
    ("flash_forward", "if (STORED && seen) S[(bh * Nq + i) * Nk + j] = s[c];",
     "if (STORED && seen) S[(bh * Nq + i) * Nk + j] = dot;", "S", "stored"),
    # the given deterministic dQ kernel without the scale: only DETERMINISTIC = true runs it
    pytest.param("flash_backward", "if (col < d) dQ[(bh * Nq + i) * d + col] = scale * dq[c];",
                 "if (col < d) dQ[(bh * Nq + i) * d + col] = dq[c];", "dQ", "deterministic",
                 marks=pytest.mark.slow),  # the backward builds four instantiations: seconds
    # S recomputed from Ks even when stored: right until the instantiation that loads no K
    pytest.param("flash_backward",
                 "const float s = STORED ? Pds[ii][y] : scale * row_dot<Dt>(Qs[ii], Ks[y]);",
                 "const float s = scale * row_dot<Dt>(Qs[ii], Ks[y]);", "dK",
                 "stored_deterministic", marks=pytest.mark.slow),
    # the max started at 0: the elements show exp left fp32's range (no max subtracted)
    ("row_softmax", "float m = -INFINITY, l = 0.0f;", "float m = 0.0f, l = 0.0f;", "y",
     "no_max"),
], ids=["stored_S_unscaled", "deterministic_dq_unscaled", "stored_reads_Ks", "rows_max_from_0"])
def test_a_slip_only_another_instantiation_or_range_shows(name, old, new, output, pattern,
                                                          tmp_path):
    report = plant(name, old, new, tmp_path)
    assert (report.status, report.finding.output, report.pattern) == (WRONG, output, pattern), (
        str(report))
    ex = write.get(name)
    assert f"hint 1: {hints.hint(hints_of(ex), output, pattern, 1)}" in str(report).splitlines()


def test_every_case_beyond_the_first_grid_names_a_hint_of_its_own():
    """A case that only fails names a hint about what it changes, never the generic
    "wrong everywhere": the score cases and every case run through another instantiation."""
    for ex in write.KERNELS.values():
        for case in ex.cases:
            if "+" in case.label or case.label in ("negative", "huge", "stored", "deterministic",
                                                   "stored_deterministic", "float16", "tf32"):
                assert hints.family(case.label) != "everywhere", (ex.name, case.label)


def test_the_score_cases_reach_the_ranges_they_name():
    """negative: every score below -104 (exp underflows to 0 in fp32); huge: |S| near 1e4;
    and q . k is exact in fp32, so any order of summation gives the same S."""
    for label, check in (("negative", lambda S: S.max() < -104),
                         ("huge", lambda S: 5e3 < np.abs(S).max() < 3e4)):
        case = next(c for c in write.get("flash_forward").cases if c.label == label)
        a = flash_cases.qkv(case)
        q, k = a["q"].astype(np.float64), a["k"].astype(np.float64)
        dots = q @ np.swapaxes(k, -1, -2)
        S = dots / np.sqrt(case.sizes["d"])
        assert check(S), (label, S.min(), S.max())
        assert np.array_equal(np.float32(dots), dots)  # representable: no rounding to hide
        # every partial sum of the dot is exact in fp32 too: reversed order gives the same
        rev = np.zeros_like(dots, dtype=np.float32)
        for j in reversed(range(q.shape[-1])):
            rev += np.float32(q[..., j, None] * k[..., None, :, j])
        assert np.array_equal(rev, np.float32(dots)), label
