"""What every checker shares: the Verdict it returns and the comparisons behind it.

A checker takes the learner's answer (a number, or a function to fill in) and returns a Verdict:
the string "right", "wrong, because ..." or "not answered yet" (for None or the `...`
placeholder; a function exercise is unanswered while it returns `...`, and wrong when it returns
None). A checker never raises on an answer: a bad type or a function that raises is a
"wrong" with the reason.
"""

from __future__ import annotations

import math

import numpy as np

NOT_YET = "not answered yet"


class Verdict(str):
    """A checker's answer; displays bare in a notebook (right, not 'right')."""

    def __repr__(self) -> str:
        return str(self)


def right() -> Verdict:
    return Verdict("right")


def wrong(why: str) -> Verdict:
    return Verdict("wrong, because " + why)


def unanswered(x) -> bool:
    return x is None or x is Ellipsis


def number(answer, what: str):
    """(float, None) for a finite real number, else (None, a wrong Verdict saying why)."""
    if isinstance(answer, (bool, np.bool_)) or not isinstance(
            answer, (int, float, np.integer, np.floating)):
        return None, wrong(f"{what} is a number; you gave {type(answer).__name__} {answer!r}")
    if not math.isfinite(float(answer)):
        return None, wrong(f"{what} is a finite number; you gave {answer!r}")
    return float(answer), None


def exact(answer, want: int, what: str, hints=(), hint: str = "") -> Verdict:
    """A count (bytes, FLOPs, a tile size): right iff equal. `hints` are (value, reason) pairs
    for the usual slips; otherwise the reason says how far off the answer is, and `hint`."""
    if unanswered(answer):
        return Verdict(NOT_YET)
    got, bad = number(answer, what)
    if bad:
        return bad
    if got == want:
        return right()
    reasons = [reason for value, reason in hints if got == value]
    if reasons:
        return _because(reasons)
    off = f"{got / want:.3g}x" if want else "not 0"
    return wrong(f"{what} is exact and yours is {off} the count; {hint}".rstrip("; "))


def _because(reasons: list[str]) -> Verdict:
    """One usual slip gives its reason; a value that two slips both give (2048 bytes is TILE = 16's
    tiles, and TILE = 32's counted in floats) gives each, since either may be the learner's."""
    reasons = list(dict.fromkeys(reasons))
    if len(reasons) == 1:
        return wrong(reasons[0])
    return wrong("that is what two different slips give: either " + "; or ".join(reasons))


def close(answer, want: float, what: str, rtol: float, hints=(), hint: str = "") -> Verdict:
    """A ratio or an intensity: right iff within rtol (relative) of want."""
    if unanswered(answer):
        return Verdict(NOT_YET)
    got, bad = number(answer, what)
    if bad:
        return bad
    if abs(got - want) <= rtol * abs(want):
        return right()
    reasons = [reason for value, reason in hints if abs(got - value) <= rtol * abs(value)]
    if reasons:
        return _because(reasons)
    return wrong(f"{what} is off by {abs(got / want - 1) * 100:.2g}% (within {rtol * 100:g}% "
                 f"counts as right); {hint}".rstrip("; "))


def call(fn, *args):
    """(result, None), or (None, Verdict) when fn is unanswered, not callable or raises."""
    if unanswered(fn):
        return None, Verdict(NOT_YET)
    if not callable(fn):
        return None, wrong(f"the answer is a function; you gave {type(fn).__name__}")
    try:
        out = fn(*args)
    except Exception as e:  # the learner's code: any failure is a reason, not a crash
        return None, wrong(f"your function raised {type(e).__name__}: {e}")
    if out is Ellipsis:  # the shipped body, `return ...`: not attempted
        return None, Verdict(NOT_YET)
    if out is None:  # a body that computes and forgets to return
        return None, wrong("your function returned None: does it end with `return`?")
    return out, None


def array(x, shape, what: str):
    """(float64 array, None) if x converts and has `shape`, else (None, a wrong Verdict)."""
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as e:
        return None, wrong(f"{what} must be an array of numbers ({e})")
    if a.shape != tuple(shape):
        return None, wrong(f"{what} must have shape {tuple(shape)}, got {a.shape}")
    return a, None


def rel_err(x, y) -> float:
    """||x - y|| / ||y||, the relative Frobenius error."""
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))
