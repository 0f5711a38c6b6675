"""The optimising schedules against brute force over every plan of small chains: Revolve's count
of recomputed blocks, and the DP optimum's recompute FLOPs at every budget, on chains whose
blocks do and do not save their own input and output (a ReLU saves its output, which is the
next block's input: one buffer, counted once). The truth is schedules.simulate, which
tests/test_schedules.py holds to the engine's measured ledger."""

import math

import numpy as np
import pytest

from ckptlab.engine import Tensor, ops
from ckptlab.recompute import profile, schedules
from ckptlab.recompute.checkpoint import Seg
from ckptlab.recompute.optimal import revolve_cost


def all_plans(c, d, held, fixed):
    """Every plan of a level over stages [c, d): plain first stage or a Seg [c, e), then the
    rest; a Seg's inside is again every plan (x_c held); fixed stages are always plain. A Seg
    covering a whole Seg's inside is left out (the same peak, twice the recompute)."""
    if c == d:
        yield []
        return
    for rest in all_plans(c + 1, d, False, fixed):
        yield [c] + rest
    if fixed[c]:
        return
    for e in range(c + 1, d + 1):
        if fixed[e - 1] or (e == d and held):
            break
        for inner in all_plans(c, e, True, fixed):
            for rest in all_plans(e, d, False, fixed):
                yield [Seg(inner)] + rest


def synthetic(xs, internal, saves_in, saves_out, flops, first=0, n_blocks=None):
    """A chain of len(internal) stages: stage i reads x_i (xs[i] bytes) and writes x_{i+1}
    (xs[i + 1]); it saves its internal buffer, and x_i and x_{i+1} where told to."""
    n = len(internal)
    stages = []
    for i in range(n):
        saved = {"a": int(internal[i])}
        saved.update({"in": int(xs[i])} if saves_in[i] else {})
        saved.update({"out": int(xs[i + 1])} if saves_out[i] else {})
        stages.append(profile.StageProfile(int(xs[i]), int(xs[i + 1]), saved, int(flops[i]),
                                           2 * int(flops[i]), 0))
    return profile.Profile(stages, first, n_blocks or n)


def brute_force(prof):
    """(peak bytes, recompute FLOPs) of every plan, simulated."""
    n = len(prof.stages)
    return [(p.peak_bytes, p.recompute_flops) for p in
            (schedules.simulate(plan, prof) for plan in all_plans(0, n, False, prof.fixed))]


def assert_dp_matches_brute_force(prof):
    """At every budget where the answer can change (each plan's peak, and one byte below it)
    the DP's plan fits and costs the brute-force minimum; below the least peak it refuses."""
    results = brute_force(prof)
    peaks = sorted({p for p, _ in results})
    for budget in sorted(set(peaks) | {p - 1 for p in peaks[1:]}):
        best = min(c for p, c in results if p <= budget)
        sched = schedules.optimal(budget, prof)
        pred = sched.predict(prof)
        assert pred.peak_bytes <= budget, (budget, sched.plan)
        assert pred.recompute_flops == best, (budget, sched.plan, pred.recompute_flops, best)
    with pytest.raises(ValueError, match=f"minimum feasible peak {peaks[0]} bytes"):
        schedules.optimal(peaks[0] - 1, prof)


def test_all_plans_counts_are_right():
    """N(n) = N(n-1) + sum_e N'(e) N(n-e) (plain first block, or a Seg of e blocks whose
    inside N'(e) may not be one Seg again): 2 plans of 1 block ([0], [[0]]), 8 of 2."""
    assert [sum(1 for _ in all_plans(0, n, False, [False] * n)) for n in range(1, 6)] == \
        [2, 8, 48, 352, 2880]


@pytest.mark.parametrize("L", range(1, 6))
def test_revolve_is_optimal_against_brute_force(L):
    """Over every plan of a uniform chain: the fewest recomputed blocks with at most s block
    inputs held by checkpoints and one block's activations at a time equals Revolve's count,
    which equals Griewank's closed form."""
    prof = synthetic([100] * (L + 1), [300] * L, [True] * L, [False] * L, [1] * L)
    best = {}
    for plan in all_plans(0, L, False, [False] * L):
        p = schedules.simulate(plan, prof)
        for s in range(1, L + 1):
            if p.peak_tapes <= 1 and p.peak_snapshots <= s:
                best[s] = min(best.get(s, math.inf), p.recompute_flops)
    for s in range(1, L + 1):
        pred = schedules.revolve(s, L).predict(prof)
        assert pred.recompute_flops == best[s] == revolve_cost(L, s)
        assert pred.peak_snapshots <= s and pred.peak_tapes == 1


def test_revolve_closed_form_equals_the_recursion():
    """C(l, s) = min_m m + C(m, s) + C(l - m, s - 1), C(1, s) = 0: the binomial formula."""
    C = {}
    for s in range(1, 6):
        for l in range(1, 41):
            if l == 1:
                C[l, s] = 0
            else:
                C[l, s] = min(m + C[m, s] + (C[l - m, s - 1] if s > 1 else
                                             (0 if l - m == 1 else math.inf))
                              for m in range(1, l))
            assert C[l, s] == revolve_cost(l, s), (l, s)


# ------------------------------------------------------------------------------ the DP optimum

# which of its boundary activations each block saves: a Linear saves its input, a ReLU its
# output, Linear+ReLU both, a pointwise op with a constant (x * 2) neither
SAVES = {"in": (True, False), "out": (False, True), "both": (True, True),
         "neither": (False, False)}


def uniform_chain(L, saves):
    si, so = SAVES[saves]
    return synthetic([256] * (L + 1), [64] * L, [si] * L, [so] * L, [1000] * L)


def random_chain(L, seed, fixed_ends=False):
    """Random sizes and FLOPs, each block saving its input and output at random (half the
    time), internal buffers sometimes empty; with fixed_ends a plain stage before and after."""
    r = np.random.default_rng(seed)
    return synthetic(r.integers(1, 50, L + 1) * 8, r.integers(0, 80, L) * 8, r.random(L) < 0.5,
                     r.random(L) < 0.5, r.integers(1, 20, L), first=int(fixed_ends),
                     n_blocks=L - 2 * int(fixed_ends))


UNIFORM = [(L, saves) for L in range(1, 6) for saves in sorted(SAVES)]


@pytest.mark.parametrize("L,saves", UNIFORM)
def test_optimal_matches_brute_force_uniform(L, saves):
    """Every L up to 5 for each kind of block (L = 6, 25,216 plans: the Linear+ReLU test)."""
    assert_dp_matches_brute_force(uniform_chain(L, saves))


@pytest.mark.parametrize("trial", range(12))
def test_optimal_matches_brute_force_random(trial):
    """L = 3..5 (6 with plain ends), random costs and what each block saves."""
    L = 3 + trial % 3 + (trial % 2)
    assert_dp_matches_brute_force(random_chain(L, trial, fixed_ends=trial % 2 == 1))


@pytest.mark.slow
def test_optimal_matches_brute_force_at_L7():
    """231,168 plans per chain: 20 s to 2 min. (L = 8, 2,190,848 plans, takes 10+ minutes:
    run assert_dp_matches_brute_force on uniform_chain(8, "both") and random_chain(8, 108) by
    hand when the DP changes.)"""
    assert_dp_matches_brute_force(uniform_chain(7, "both"))
    assert_dp_matches_brute_force(random_chain(7, 107))


def test_optimal_on_a_linear_relu_chain():
    """The chain that showed the double count, built with the engine and profiled: 6 blocks
    relu(x W) saving x (Linear) and relu's output (the next block's input). At a budget of 6
    activations (1536 bytes) the DP returned [[0, 1], [2, 3], 4, 5] (4 blocks recomputed)
    though [0, 1, 2, [3, 4], 5] fits as well and recomputes 2; without a budget it refused to
    store everything, thinking that peak was 7 activations + 6 outputs."""
    R = np.random.default_rng(0)
    Ws = [Tensor(R.standard_normal((8, 8)).astype(np.float32), requires_grad=True)
          for _ in range(6)]
    blocks = [lambda x, W=W: ops.relu(ops.linear(x, W)) for W in Ws]
    prof = profile.profile(blocks, Tensor(R.standard_normal((8, 8)).astype(np.float32)))
    act = 8 * 8 * 4  # one (8, 8) float32 activation
    assert [s.saved for s in prof.stages] == [{"in": act, "out": act}] * 6
    none = schedules.none(6).predict(prof)
    assert none.peak_bytes == 7 * act  # x_0 .. x_6, each once
    assert schedules.optimal(7 * act, prof).plan == list(range(6))
    block = prof.stages[0].fwd_flops
    assert schedules.optimal(6 * act, prof).predict(prof).recompute_flops == 2 * block
    assert_dp_matches_brute_force(prof)
