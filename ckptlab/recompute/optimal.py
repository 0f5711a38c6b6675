"""The two optimising schedules: Revolve (binomial, uniform chain) and a dynamic program over a
measured, heterogeneous chain. Both return plans (ckptlab.recompute.plan.Seg trees).

A plan level over blocks [c, d) runs its items forward, then backward in reverse. A plain block
keeps its saved bytes until its backward; a Seg [c, e) keeps its input x_c, runs without grad,
and in the backward is recomputed as a level of its own (x_c already held) whose items may be
Segs again. Recompute cost of a Seg = its blocks' forward FLOPs + its inner level's cost.
"""

from __future__ import annotations

from math import comb

from ckptlab.recompute.plan import Seg

# ------------------------------------------------------------------------------ revolve


def revolve_cost(l: int, s: int) -> int:
    """Fewest block forwards to recompute when reversing l blocks with s snapshots (the first
    block's input counts as one): with r the least integer with beta(s, r) = C(s + r, s) >= l,
    the cost is r*l - beta(s + 1, r - 1) = r*l - C(s + r, s + 1) (Griewank & Walther 2000)."""
    if l < 1 or s < 1:
        raise ValueError(f"revolve_cost: need l >= 1 and s >= 1, got l={l}, s={s}")
    r = 0
    while comb(s + r, s) < l:
        r += 1
    return r * l - comb(s + r, s + 1)


def _split_cost(length: int, m: int, s: int) -> float:
    """Cost of advancing m blocks, reversing the other length - m with s - 1 snapshots, then
    the first m with s."""
    rest = length - m
    tail = (0 if rest == 1 else float("inf")) if s == 1 else revolve_cost(rest, s - 1)
    return m + revolve_cost(m, s) + tail


def revolve_plan(L: int, s: int) -> list:
    """The binomial plan: [Seg(first m blocks, reversed again with s)] + the last L - m blocks
    with s - 1 snapshots, m chosen so that the total is revolve_cost(L, s)."""

    def level(a: int, b: int, s: int) -> list:
        if b - a == 1:
            return [a]
        m = min(range(1, b - a), key=lambda m: _split_cost(b - a, m, s))
        return [Seg(level(a, a + m, s))] + level(a + m, b, s - 1)

    return level(0, L, s)


# ------------------------------------------------------------------------------ optimal


def _pareto(points: list) -> list:
    """Keep the points no other beats on both peak and cost, sorted by peak (cost falling)."""
    out = []
    for p in sorted(points, key=lambda t: (t[0], t[1])):
        if not out or p[1] < out[-1][1]:
            out.append(p)
    return out


def _combine(f1: list, f2: list) -> list:
    """Pairs (i, j) of points of two frontiers that run one after the other while the same
    hold is kept: peak max(p1, p2), cost c1 + c2. Only the Pareto-useful pairs: for each
    point, the cheapest partner whose peak is not above it."""
    out = []
    for A, B, swap in ((f1, f2, False), (f2, f1, True)):
        j = -1
        for i, (p, c, _) in enumerate(A):
            while j + 1 < len(B) and B[j + 1][0] <= p:
                j += 1
            if j >= 0:
                out.append((p, c + B[j][1], (j, i) if swap else (i, j)))
    return out


def optimal_plan(prof, budget_bytes) -> list:
    """The plan over all stages of `prof` with the fewest recompute FLOPs among those whose
    peak saved bytes is at most `budget_bytes`.

    frontier(c, d, held, inner) lists the Pareto-optimal (peak, cost) of a level over [c, d),
    peak counted above what is already held; held: x_c is already kept (by the enclosing Seg,
    or by the previous plain stage that saves its output x_c: one buffer, counted once);
    inner: the level is a Seg's inside (a Seg over all of it would only recompute twice).
    Its first item is either
      plain c:     peak = a_c + (x_c if c saves its input, unless held)
                          + (x_{c+1} if c saves its output) + rest's peak (x_{c+1} then held),
      Seg [c, e):  peak = (x_c unless held) + max(inner level's peak, rest's peak),
                   cost = F(c..e-1) + inner cost + rest cost.
    Nothing outside [c, d) but x_c is held in common with the level: the items after a Seg
    are released before its recompute. Stages outside the blocks (prof.fixed) are always
    plain. Memoised on the stage contents of [c, d), so a uniform chain of L blocks costs
    O(L) states rather than O(L^2)."""
    st, fixed = prof.stages, prof.fixed
    n = len(st)
    x = [s.in_bytes for s in st]
    si = ["in" in s.saved for s in st]
    so = [s.saved.get("out", 0) for s in st]  # x_{c+1}'s bytes if stage c saves its output
    a = [sum(b for k, b in s.saved.items() if k not in ("in", "out")) for s in st]
    F = [s.fwd_flops for s in st]
    prefix = [0]
    for f in F:
        prefix.append(prefix[-1] + f)
    kinds, sig = {}, [[0] * (n + 1) for _ in range(n + 1)]  # sig[c][d]: id of stages c..d-1
    ids = {}
    for c in range(n):
        for d in range(c + 1, n + 1):
            t = kinds.setdefault((x[d - 1], a[d - 1], si[d - 1], so[d - 1], F[d - 1],
                                  fixed[d - 1]), len(kinds))
            sig[c][d] = ids.setdefault((sig[c][d - 1] if d - 1 > c else -1, t), len(ids))
    memo = {}

    def frontier(c: int, d: int, held: bool, inner: bool) -> list:
        key = (sig[c][d], held, inner)
        if key in memo:
            return memo[key]
        points = []
        h = a[c] + (x[c] if si[c] and not held else 0) + so[c]
        if c + 1 == d:
            points.append((h, 0, ("plain", None)))
        else:
            points += [(h + p, cost, ("plain", j))
                       for j, (p, cost, _) in enumerate(frontier(c + 1, d, so[c] > 0, False))]
        hold = 0 if held else x[c]
        for e in range(c + 1, d + 1):
            if fixed[e - 1] or (e == d and inner):
                break
            sub, f = frontier(c, e, True, True), prefix[e] - prefix[c]
            if e == d:
                points += [(hold + p, cost + f, ("seg", e - c, i, None))
                           for i, (p, cost, _) in enumerate(sub)]
            else:
                points += [(hold + p, cost + f, ("seg", e - c, i, j))
                           for p, cost, (i, j) in _combine(sub, frontier(e, d, False, False))]
        memo[key] = _pareto(points)
        return memo[key]

    def build(c: int, d: int, held: bool, inner: bool, k: int) -> list:
        choice = memo[(sig[c][d], held, inner)][k][2]
        if choice[0] == "plain":
            rest = build(c + 1, d, so[c] > 0, False, choice[1]) if choice[1] is not None else []
            return [c] + rest
        _, length, i, j = choice
        rest = build(c + length, d, False, False, j) if j is not None else []
        return [Seg(build(c, c + length, True, True, i))] + rest

    top = frontier(0, n, False, False)
    if budget_bytes < top[0][0]:
        raise ValueError(f"optimal: budget {int(budget_bytes)} bytes is below the minimum "
                         f"feasible peak {top[0][0]} bytes for this chain")
    k = max(i for i, p in enumerate(top) if p[0] <= budget_bytes)
    return build(0, n, False, False, k)
