"""From "these elements differ from float64" to a reason a learner can act on.

Two kinds of evidence, in order:
1. which cases fail. Each case changes one thing from "base", so "right at base, wrong only
   with the causal mask" names the cause's class by itself;
2. where, inside a failing case, the wrong elements are: never written (the kernel left the
   NaN poison), NaN or inf computed, all zero, off by one constant factor, only in the last
   partial tile of an axis, only past the first tile, only in heads after the first.
`diagnose` returns the first wrong output's pattern and a sentence saying where; the hints
(hints.py) turn the pattern into a question.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from ckptlab.exercises.write import classes


# factors a slip typically multiplies an output by, tried in this order (value, name)
def factor_names(case) -> list:
    s, o = case.sizes, case.options
    d = s.get("d")
    out = [(-1.0, "-1 (the sign)"), (2.0, "2"), (0.5, "1/2")]
    if d:
        scale = o.get("scale") or 1 / np.sqrt(d)
        out += [(scale, "the softmax scale"), (1 / scale, "1 / (the softmax scale)")]
    for k in ("Nk", "Nq", "C", "K"):
        if s.get(k):
            out += [(float(s[k]), k), (1.0 / s[k], f"1/{k}")]
    return out


def mismatch(x, r, rtol: float) -> np.ndarray:
    """Elements of x that differ from the float64 truth r by more than rtol of r's largest
    finite magnitude (equal infinities match; NaN never does)."""
    x = np.asarray(x, dtype=np.float64)
    finite = r[np.isfinite(r)]
    scale = float(np.abs(finite).max()) if finite.size else 1.0
    with np.errstate(invalid="ignore"):
        ok = (x == r) | (np.abs(x - r) <= rtol * max(scale, 1e-30))
    return ~ok


@dataclass
class Failure:
    """One output wrong in one case."""

    case: object
    output: object
    x: np.ndarray
    r: np.ndarray
    bad: np.ndarray
    unwritten: np.ndarray | None = None  # elements the kernel never wrote, where known


@dataclass
class Finding:
    output: str
    pattern: str
    where: str      # a sentence: where the output is wrong
    example: str    # one wrong element, yours against float64
    case: object
    rank: int = 0   # how much the finding says about the cause (rank_of)
    others: list = field(default_factory=list)  # the other wrong outputs' findings


# patterns that name the cause's class whatever case shows them (classes.py, special factors)
CLASSES = {"uninit", "lane0", "no_max", "scale_power", "dropout_scale"}


def rank_of(pattern: str, alternative: bool = False, by_case: bool = False) -> int:
    """How telling a finding is: a slip it equals (6), a class by its elements (5), the one
    case that fails (4), "across tiles" or never written (3), a shape of the error (2), or
    only "wrong everywhere" (1). The report leads with the most telling output's finding."""
    if alternative:
        return 6
    if pattern in CLASSES:
        return 5
    if by_case:
        return 4
    if pattern in ("multi_tile", "unwritten"):
        return 3
    return 1 if pattern == "everywhere" else 2


def _ranges(idx) -> str:
    idx = sorted(int(i) for i in idx)
    parts, start, prev = [], idx[0], idx[0]
    for i in idx[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(f"{start}" if start == prev else f"{start}..{prev}")
        if i is not None:
            start = prev = i
    return ", ".join(parts[:4]) + (", ..." if len(parts) > 4 else "")


def _axis_pattern(f: Failure) -> tuple[str, str] | None:
    """(pattern, sentence) when the wrong elements lie in one telling part of one axis."""
    bad, axes = f.bad, f.output.axes
    for a, name in enumerate(axes):
        n = bad.shape[a]
        idx = np.flatnonzero(bad.any(axis=tuple(k for k in range(bad.ndim) if k != a)))
        if idx.size in (0, n):
            continue
        where = f"only at {name} = {_ranges(idx)} (of 0..{n - 1})"
        if name in ("b", "h", "bh"):
            if 0 not in idx:
                return "heads", f"{where}: the first {name} is right"
            continue
        T = f.output.tiles.get(name)
        if T and n % T and idx.min() >= n - n % T:
            return f"tail_{name}", f"{where}: the last, partial tile of {name} (tiles of {T})"
        if T and n > T and idx.min() >= T:
            return f"after_first_tile_{name}", f"{where}: the first tile of {name} ({T}) is right"
        if T and idx.max() < T <= n - 1:
            return f"first_tile_{name}", f"{where}: only the first tile of {name} ({T}) is wrong"
        return f"part_{name}", where
    return None


def _factor(f: Failure) -> tuple[str, str] | None:
    """(pattern, sentence) when x = c * r for one constant c (over elements with r != 0); a
    power of the softmax scale or the dropout scale's factor is a pattern of its own."""
    r, x = f.r, f.x.astype(np.float64)
    use = np.isfinite(r) & (np.abs(r) > 1e-6 * np.abs(r[np.isfinite(r)]).max(initial=0))
    if use.sum() < 2 or not np.isfinite(x[use]).all():
        return None
    ratio = x[use] / r[use]
    c = float(np.median(ratio))
    if c == 0 or not np.all(np.abs(ratio - c) <= 1e-3 * abs(c)) or abs(c - 1) < 1e-3:
        return None
    for value, name in factor_names(f.case):
        if abs(c / value - 1) < 1e-3:
            return "factor", f"everywhere by the same factor, {c:.6g} = {name}"
    for value, name, pattern in classes.special_factors(f.case):
        if abs(c / value - 1) < 1e-3:
            return pattern, f"everywhere by the same factor, {c:.6g} = {name}"
    return "factor", f"everywhere by the same factor, {c:.6g}"


def _row_factor(f: Failure) -> tuple[str, str] | None:
    """(pattern, sentence) when each row of x is its row of r times that row's own constant
    (a per-row normalisation such as 1 / l_i missing or doubled)."""
    if f.x.ndim < 2 or f.bad.shape[-1] < 2:
        return None
    r, x = f.r, f.x.astype(np.float64)
    if not (np.isfinite(x).all() and np.isfinite(r).all()):
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = x / r
    use = np.abs(r) > 1e-6 * np.abs(r).max(initial=0)
    rows = f.bad.any(axis=-1)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a row with no usable element
        c = np.nanmedian(np.where(use, ratio, np.nan), axis=-1, keepdims=True)
    same = np.where(use, np.abs(ratio - c) <= 1e-3 * np.abs(c), True).all(axis=-1)
    if rows.sum() < 2 or not same[rows].all():
        return None
    spread = c[rows][..., 0]
    if not spread.any():
        idx = np.argwhere(rows)
        return "zero", (f"{len(idx)} rows are all 0 where float64 is not, e.g. row "
                        f"{tuple(int(i) for i in idx[0])}")
    return "row_factor", (f"each wrong row is off by a factor of its own (from {spread.min():.4g} "
                          f"to {spread.max():.4g}): the row's values are right up to a "
                          "per-row scale")


def locate(f: Failure) -> tuple[str, str]:
    """(pattern, sentence) for one failing output in one case."""
    n, total = int(f.bad.sum()), f.bad.size
    if f.unwritten is not None and f.unwritten.any():
        idx = np.argwhere(f.unwritten)
        sub = _axis_pattern(Failure(f.case, f.output, f.x, f.r, f.unwritten))
        where = f" ({sub[1]})" if sub else ""
        return "unwritten", (f"{int(f.unwritten.sum())} of {total} elements were never written "
                             f"(they still hold the poison the output was filled with), e.g. "
                             f"{f.output.name}{tuple(int(i) for i in idx[0])}{where}")
    for detect in (classes.uninitialised, classes.blow_up, classes.lane_zero):
        if (found := detect(f)) is not None:
            return found
    nonfinite = ~np.isfinite(f.x) & np.isfinite(f.r)
    if nonfinite.any():
        kinds = "NaN" if np.isnan(f.x[nonfinite]).all() else "NaN or inf"
        sub = _axis_pattern(Failure(f.case, f.output, f.x, f.r, nonfinite))
        return "nan", (f"{int(nonfinite.sum())} of {total} elements are {kinds} where float64 "
                       f"is finite" + (f", {sub[1]}" if sub else ", everywhere"))
    if not np.any(f.x[np.isfinite(f.x)]) and np.any(f.r[np.isfinite(f.r)]):
        return "zero", "every element is 0"
    if (fac := _factor(f)) is not None:
        return fac
    if (fac := _row_factor(f)) is not None:
        return fac
    if (ax := _axis_pattern(f)) is not None:
        return ax[0], f"{n} of {total} elements are wrong, {ax[1]}"
    return "everywhere", f"{n} of {total} elements are wrong, in every part of it"


def example(f: Failure) -> str:
    """The worst wrong element: its index, yours and float64's."""
    with np.errstate(invalid="ignore"):
        err = np.where(f.bad, np.abs(f.x.astype(np.float64) - f.r), -1.0)
    err = np.where(np.isnan(err), np.inf, err)
    at = np.unravel_index(int(np.argmax(err)), err.shape)
    idx = ", ".join(str(int(i)) for i in at)
    return f"{f.output.name}[{idx}] is {float(f.x[at]):.6g}, float64 says {float(f.r[at]):.6g}"


def same(x, alt, rtol: float) -> bool:
    """x equals the alternative truth `alt` (within rtol; NaN where it has NaN too)."""
    x = np.asarray(x, np.float64)
    return not (mismatch(x, alt, rtol) & ~(np.isnan(x) & np.isnan(alt))).any()


def alternative(f: Failure, alternatives: dict, inputs: dict, outputs: dict, rtol: float,
                memo: dict | None = None):
    """(pattern, what) of the first alternative truth that the failing case's outputs equal,
    every output the alternative gives (the wrong ones and the right ones alike), or None. An
    alternative may fit itself to the learner's outputs (an attribute `fits` on its function:
    it is called with them too) and say what it found (its dict's "_what")."""
    mine = outputs[f.case.label]  # output name -> the learner's array
    memo = {} if memo is None else memo
    for pattern, (what, fn) in alternatives.items():
        key = (pattern, f.case.label)
        if key not in memo:
            args = (f.case, inputs[f.case.label]) + ((mine,) if getattr(fn, "fits", False)
                                                      else ())
            with np.errstate(all="ignore"):  # a slip's truth may hold inf and NaN
                memo[key] = fn(*args)
        alt = memo[key]
        if alt is None or f.output.name not in alt:
            continue
        if all(same(x, np.asarray(alt[n], np.float64), rtol) for n, x in mine.items()
               if n in alt):
            return pattern, alt.get("_what", what)
    return None


def _output_finding(mine: list, cases: list, alternatives, inputs, results, rtol,
                    memo) -> Finding:
    """The finding for one output from its failures (one per failing case)."""
    name = mine[0].output.name
    first = next(f for c in cases for f in mine if f.case.label == c.label)
    if alternatives and (alt := alternative(first, alternatives, inputs, results, rtol,
                                            memo)) is not None:
        where = (f"{name} is wrong in case {first.case.label} ({first.case.describe()}), and "
                 f"it equals {alt[1]}")
        return Finding(name, alt[0], where, example(first), first.case,
                       rank_of(alt[0], alternative=True))
    wrong = {f.case.label for f in mine}
    base = cases[0].label
    if base not in wrong:
        phrases = [c.phrase for c in cases if c.label in wrong]
        pattern, sub = locate(first)
        where = (f"{name} is right in the base case and wrong only with: {'; '.join(phrases)}. "
                 f"In the first of those ({first.case.describe()}): {sub}")
        # the case names the cause's class; "never written" and a class of its own say more
        if pattern == "unwritten" or pattern in CLASSES:
            return Finding(name, pattern, where, example(first), first.case, rank_of(pattern))
        return Finding(name, first.case.label, where, example(first), first.case,
                       rank_of(first.case.label, by_case=True))
    f = next(f for f in mine if f.case.label == base)
    single = [c for c in cases if c.label == "one_tile"]
    pattern, sub = locate(f)
    if single and "one_tile" not in wrong:
        where = (f"{name} is right with a single tile ({single[0].describe()}) and wrong with "
                 f"more than one ({f.case.describe()}): {sub}")
        if pattern not in ("unwritten", "nan") and pattern not in CLASSES:
            pattern = "multi_tile"
        return Finding(name, pattern, where, example(f), f.case, rank_of(pattern))
    return Finding(name, pattern, f"{name} is wrong in every case. In the base case "
                   f"({f.case.describe()}): {sub}", example(f), f.case, rank_of(pattern))


def diagnose(failures: list, cases: list, outputs: list, alternatives: dict | None = None,
             inputs: dict | None = None, results: dict | None = None,
             rtol: float = 1e-4) -> Finding:
    """A finding for every wrong output (in `outputs` order), the most telling first (rank_of;
    on a tie the earlier output): its `others` hold the rest. An output that equals one of
    `alternatives` (pattern -> (what, truth function)) on its first failing case, with every
    other output of that case (`results`: case label -> output name -> array), is reported as
    that slip."""
    order = [o.name for o in outputs]
    memo: dict = {}
    found = [_output_finding([f for f in failures if f.output.name == name], cases,
                             alternatives, inputs, results, rtol, memo)
             for name in order if any(f.output.name == name for f in failures)]
    main = max(found, key=lambda g: (g.rank, -order.index(g.output)))
    main.others = [g for g in found if g is not main]
    return main
