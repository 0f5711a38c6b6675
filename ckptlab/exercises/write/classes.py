"""Element patterns that name a cause's class by themselves, whatever the kernel: a value read
before it was ever set (the check's poison of locals), a result right only in the elements lane
0 owns (a reduction that left the row's value in lane 0), an exp that overflowed or underflowed
(no max subtracted), and a constant factor that is a power of the softmax scale or the dropout
scale's (1 - p) / p.

Each detector takes a diagnose.Failure and returns (pattern, sentence) or None; diagnose.locate
tries them before the generic patterns (NaN, zero, a factor, a part of an axis).
"""

from __future__ import annotations

import numpy as np

from ckptlab.emu.build import POISON_FLOAT

# a finite value this large where float64 is of order 1 is no sum of the inputs: it is the
# poison an uninitialised local starts with (-1.69e38), or a few of them added or scaled
POISON_MAGNITUDE = 1e36
LANE_WIDTHS = (32, 16, 8, 4)  # lane groups a row is split over (a warp, a flash row group)


def uninitialised(f) -> tuple[str, str] | None:
    """Elements near the poison of locals (-1.69e38, or -inf from two of them added), in a
    case with no large scores: a local read before its first write."""
    x, r, bad = f.x.astype(np.float64), f.r, f.bad
    modest = np.isfinite(r) & (np.abs(r) < 1e30)
    huge = bad & modest & np.isfinite(x) & (np.abs(x) >= POISON_MAGNITUDE)
    neg_inf = bad & modest & (x == -np.inf)
    if not huge.any() and not (neg_inf.any() and not blows_up_case(f.case)):
        return None
    n = int((huge | neg_inf).sum())
    at = tuple(int(i) for i in np.argwhere(huge | neg_inf)[0])
    return "uninit", (f"{n} of {bad.size} elements are about {POISON_FLOAT:.3g} or -inf, e.g. "
                      f"{f.output.name}{at}: the value the check gives every local variable "
                      "before its first write, so a variable (an accumulator?) is read before "
                      "it is set")


def lane_zero(f) -> tuple[str, str] | None:
    """Along the last axis, the elements at index 0, W, 2W, ... (lane 0 of each group of W
    lanes) are right and the others wrong: a reduction whose result only lane 0 holds."""
    bad = f.bad
    n = bad.shape[-1]
    for w in LANE_WIDTHS:
        if n <= w:
            continue
        own = (np.arange(n) % w) == 0
        if bad[..., own].any():
            continue
        rest = bad[..., ~own]
        if rest.mean() >= 0.5:
            axis = f.output.axes[-1]
            return "lane0", (f"only the elements {axis} = 0, {w}, {2 * w}, ... (those lane 0 of "
                             f"each group of {w} lanes owns) are right: the others are wrong in "
                             f"{rest.mean():.0%} of their places. A reduction (sum or max) left "
                             "the row's value in lane 0 only; the other lanes used their own "
                             "part")
    return None


def blows_up_case(case) -> str | None:
    """'overflow' or 'underflow' where the case's scores are large or very negative (said by
    its label or phrase), else None."""
    words = f"{case.label} {case.phrase}".lower()
    if "negative" in words or "underflow" in words:
        return "underflow"
    if "large" in words or "overflow" in words or "|s|" in words:
        return "overflow"
    return None


def blow_up(f) -> tuple[str, str] | None:
    """NaN, inf or zero rows where float64 is finite and not zero, in a case with large or very
    negative scores: exp of an unshifted score left fp32's range."""
    kind = blows_up_case(f.case)
    if kind is None:
        return None
    x, r = f.x.astype(np.float64), f.r
    finite = np.isfinite(r)
    broken = f.bad & finite & (~np.isfinite(x) | ((x == 0) & (r != 0)))
    if broken.sum() < max(2, 0.1 * f.bad.sum()):
        return None
    what = ("exp(x) is inf in fp32 for x > 88.7, and inf / inf is NaN" if kind == "overflow"
            else "exp(x) is 0 in fp32 for x < -103, and a row whose every exp is 0 sums to 0")
    return "no_max", (f"{int(broken.sum())} of {f.bad.size} elements are NaN, inf or 0 where "
                      f"float64 is finite ({kind}: {what}), as when a score's exp is taken "
                      "without the row's max subtracted")


def special_factors(case) -> list:
    """Factors that name a slip of their own (value, name, pattern): powers of the softmax scale
    and the dropout scale taken as 1/p."""
    s, o = case.sizes, case.options
    out = []
    if s.get("d"):
        scale = o.get("scale") or 1 / np.sqrt(s["d"])
        out += [(scale ** 2, "the softmax scale squared", "scale_power"),
                (scale ** -2, "1 / (the softmax scale squared)", "scale_power"),
                (scale ** 3, "the softmax scale cubed", "scale_power")]
    p = o.get("dropout_p") or 0.0
    if 0 < p < 1 and abs(p - 0.5) > 1e-6:
        out += [((1 - p) / p, f"(1 - p) / p with p = {p:g}: the kept P scaled by 1/p, not "
                 "1/(1 - p)", "dropout_scale"),
                (1 / (1 - p), f"1 / (1 - p) with p = {p:g}: the dropout scale applied twice",
                 "dropout_scale"),
                (1 - p, f"1 - p with p = {p:g}: the kept P never scaled by 1 / (1 - p)",
                 "dropout_scale")]
    return out
