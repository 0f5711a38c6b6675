"""Checkers of labs/04_flash_forward.ipynb (the flash forward), one function per exercise.

The expected values come from ckptlab itself (the traffic models, the roofline, the float64
reference), never typed in, so an exercise follows the kernels if they change.
"""

from __future__ import annotations

import numpy as np

from ckptlab import reference
from ckptlab.exercises.verdict import (
    NOT_YET,
    Verdict,
    array,
    call,
    exact,
    number,
    right,
    unanswered,
    wrong,
)
from ckptlab.exercises.write import in_notebook as write_kernel  # noqa: F401 (the labs' kernel cells)
from ckptlab.kernels import table
from ckptlab.measure import traffic


def online_merge(fn) -> Verdict:
    """fn(m_a, l_a, m_b, l_b) -> (m, l): merge two partial softmax states of the same rows
    (m: running max, l: sum of exp(x - m) over the part seen; an empty part has m = -inf,
    l = 0) into the state of both parts. Arrays of shape (rows,). Two empty parts (a fully
    masked row) merge into an empty state, not NaN."""
    g = np.random.default_rng(4)
    x = g.standard_normal((5, 12)) * 3
    x[1] += 800.0  # rows whose exp would overflow unless the exponents stay <= 0
    x[2, 6:] -= 900.0
    # the truth: L = logsumexp of each row, from the reference with S = 1 * x I^T = x
    _, L = reference.probabilities(x[None, None], np.eye(12)[None, None], scale=1.0)
    for cut in (0, 3, 6, 11):
        a, b = x[:, :cut], x[:, cut:]
        m_a = a.max(axis=1) if cut else np.full(5, -np.inf)
        l_a = np.exp(a - m_a[:, None]).sum(axis=1) if cut else np.zeros(5)
        m_b = b.max(axis=1)
        l_b = np.exp(b - m_b[:, None]).sum(axis=1)
        out, bad = call(fn, m_a.copy(), l_a.copy(), m_b.copy(), l_b.copy())
        if bad:
            return bad
        if (bad := _pair(out)):
            return bad
        (m, bad), (l, bad2) = array(out[0], (5,), "m"), array(out[1], (5,), "l")
        if bad or bad2:
            return bad or bad2
        with np.errstate(all="ignore"):
            got = m + np.log(l)
        if not np.all(np.isfinite(got)):
            return wrong(f"m + log l is not finite (split at column {cut}): some exponent is "
                          "positive, or an empty part (m = -inf, l = 0) was not added as 0. "
                          "Against which common maximum does no exponent exceed 0?")
        if np.abs(got - L[0, 0]).max() > 1e-12 * np.abs(L[0, 0]).max():  # float64 rounding
            if np.allclose(l, l_a + l_b):
                return wrong("l_a and l_b were summed under different maxima: bring both to "
                              "the same one first. What factor turns a sum of exp(x - m_a) "
                              "into a sum of exp(x - m)?")
            return wrong(f"m + log l differs from the row's logsumexp (split at column {cut})")
        if not np.array_equal(m, np.maximum(m_a, m_b)):
            return wrong("m + log l is right but m is not the row max: keep m = max(m_a, m_b) "
                          "so the next tile's exponents stay <= 0")
    return _both_empty(fn)


def _pair(out) -> Verdict | None:
    """None when `out` is a pair (a tuple or a list of two), else the verdict saying so."""
    if isinstance(out, (tuple, list)) and len(out) == 2:
        return None
    what = f"a {type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list)) else \
        type(out).__name__
    return wrong(f"the function returns a pair (m, l); it returned {what}")


def _both_empty(fn) -> Verdict:
    """A fully masked row (causal attention with more keys masked than seen, a tile past the
    diagonal): both parts empty. Their merge is empty too, m = -inf and l = 0, never NaN."""
    m_a, l_a = np.array([-np.inf, -np.inf, 0.5]), np.array([0.0, 0.0, 2.0])
    m_b, l_b = np.array([-np.inf, 1.0, -np.inf]), np.array([0.0, 3.0, 0.0])
    with np.errstate(all="ignore"):
        out, bad = call(fn, m_a.copy(), l_a.copy(), m_b.copy(), l_b.copy())
    if bad:
        return bad
    if (bad := _pair(out)):
        return bad
    (m, bad), (l, bad2) = array(out[0], (3,), "m"), array(out[1], (3,), "l")
    if bad or bad2:
        return bad or bad2
    if np.isnan(l[0]) or np.isnan(m[0]):
        return wrong("two empty parts (a fully masked row: m_a = m_b = -inf, l_a = l_b = 0) "
                      "give NaN: with m = -inf an exponent m_a - m is -inf + inf. An empty part "
                      "must add exactly 0: how does kernels/softmax_rows.cu keep it from "
                      "reaching the exponential?")
    if not (m[0] == -np.inf and l[0] == 0.0):
        return wrong(f"two empty parts must merge into an empty state (m = -inf, l = 0); you "
                      f"return m = {m[0]}, l = {l[0]}")
    if not (np.allclose(l[1:], [3.0, 2.0], rtol=1e-12) and np.array_equal(m[1:], [1.0, 0.5])):
        return wrong("merging an empty part with a non-empty one must return the non-empty "
                      f"state unchanged (m = [1, 0.5], l = [3, 2]); you return m = {m[1:]}, "
                      f"l = {l[1:]}")
    return right()


def flash_tile_rows(answer, d: int = 128, Bc: int = 16) -> Verdict:
    """The largest Br (query rows per tile; a multiple of 8, the lanes per row) for which
    attn_flash_fwd<d, Br, Bc> fits the 48 KiB of static shared memory."""
    fits = [Br for Br in range(table.LANES, table.MAX_TILE + 1, table.LANES)
            if table.flash_fwd_shared_bytes(d, Br, Bc) <= table.SHARED_LIMIT]
    want = max(fits)
    if unanswered(answer):
        return Verdict(NOT_YET)
    got, bad = number(answer, "Br")
    if bad:
        return bad
    if got == want:
        return right()
    if got != int(got) or got < table.LANES or int(got) % table.LANES:
        return wrong(f"Br must be a positive multiple of {table.LANES} (each query row "
                      f"has {table.LANES} lanes); you gave {answer!r}")
    need = table.flash_fwd_shared_bytes(d, int(got), Bc)
    if need > table.SHARED_LIMIT:
        return wrong(f"Br={int(got)} needs {need:,} bytes of shared memory at d={d}, Bc={Bc}: "
                      f"over the {table.SHARED_LIMIT:,}-byte limit")
    return wrong(f"Br={int(got)} fits ({need:,} bytes) but a larger multiple of "
                  f"{table.LANES} fits too")


def flash_saved_bytes(answer, B: int, H: int, N: int, d: int) -> Verdict:
    """Bytes the flash forward keeps for its backward, for q, k, v of shape (B, H, N, d)."""
    (fwd,) = traffic.flash_forward_traffic(B, H, N, N, d)
    want = fwd.bytes_written  # it writes exactly what it keeps: O and L
    return exact(answer, want, "the byte count", hints=[
        (fwd.write["O"], "O alone is not enough: the backward needs L = m + log l (one fp32 "
                         "per query row) to recompute P = exp(S - L)"),
        (want + traffic.BYTES * B * H * N * N, "nothing N x N is kept: P is recomputed"),
        (want / traffic.BYTES, "that counts elements: fp32 is 4 bytes each"),
    ], hint="O has shape (B, H, N, d) and L shape (B, H, N)")

