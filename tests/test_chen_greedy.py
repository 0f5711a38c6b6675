"""chen_greedy is Chen et al. 2016's Algorithm 3 as published (docs/references.md): walk the
blocks adding each one's size to a running total; when the total exceeds b, the block just
added closes its segment (a checkpoint after it) and the total restarts from 0. Expected plans
are worked out by hand from that definition; random chains check the property that pins the
partition down (every closed segment is the shortest prefix whose sum exceeds b)."""

import numpy as np
import pytest
from test_optimal import synthetic

from ckptlab.recompute import schedules
from ckptlab.recompute.checkpoint import Seg


def chain(sizes):
    """A profile whose block i saves exactly sizes[i] bytes (one internal buffer)."""
    n = len(sizes)
    return synthetic([8] * (n + 1), sizes, [False] * n, [False] * n, [1] * n)


def segments(sched) -> list:
    assert all(isinstance(s, Seg) and s.policy is None for s in sched.plan)
    return [list(s.items) for s in sched.plan]


# (sizes, b, segments) worked by hand. Running totals, a cut marked |:
CASES = [
    # 3, 7, 9 > 7 | 5, 6, 12 > 7 |     (7 = b does not cut: the total must exceed b)
    ([3, 4, 2, 5, 1, 6], 7, [[0, 1, 2], [3, 4, 5]]),
    # 2, 4, 6 > 4 | 2                   (a segment whose sum equals b stays open)
    ([2, 2, 2, 2], 4, [[0, 1, 2], [3]]),
    # 2, 4, 6 > 5 | 2, 4                (the last segment keeps what is left, under b)
    ([2, 2, 2, 2, 2], 5, [[0, 1, 2], [3, 4]]),
    # 9 > 3 | 1, 2, 3, 4 > 3 | 1        (a block bigger than b closes its own segment)
    ([9, 1, 1, 1, 1, 1], 3, [[0], [1, 2, 3, 4], [5]]),
    # every total exceeds 0: one block per segment
    ([5, 5, 5], 0, [[0], [1], [2]]),
    # 15 never exceeds 15: one segment, everything recomputed from the chain's input
    ([5, 5, 5], 15, [[0, 1, 2]]),
]


@pytest.mark.parametrize("sizes,b,expected", CASES)
def test_expected_plans_from_the_papers_definition(sizes, b, expected):
    assert segments(schedules.chen_greedy(b, chain(sizes))) == expected


@pytest.mark.parametrize("seed", range(20))
def test_each_closed_segment_is_the_shortest_that_exceeds_b(seed):
    """Cover the blocks in order; every segment but the last has a sum > b while its sum
    without its last block is <= b; the last one ends the chain either that way or with a
    sum <= b."""
    r = np.random.default_rng(seed)
    sizes = [int(s) for s in r.integers(0, 40, r.integers(1, 12))]
    b = int(r.integers(0, 80))
    segs = segments(schedules.chen_greedy(b, chain(sizes)))
    assert [i for s in segs for i in s] == list(range(len(sizes)))
    for k, s in enumerate(segs):
        total = sum(sizes[i] for i in s)
        closed = total > b and total - sizes[s[-1]] <= b
        assert closed or (k == len(segs) - 1 and total <= b), (sizes, b, segs)


def test_sizes_are_the_blocks_saved_bytes():
    """A block's size is everything it saves (input, output and inside) between stages."""
    prof = synthetic([4, 4, 4, 4], [10, 10, 10], [True] * 3, [True] * 3, [1] * 3)
    assert [sum(s.saved.values()) for s in prof.stages] == [18, 18, 18]
    assert segments(schedules.chen_greedy(18, prof)) == [[0, 1], [2]]  # 18, 36 > 18 | 18


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf")])
def test_a_budget_must_be_a_finite_number_of_bytes(bad):
    with pytest.raises(ValueError, match="chen_greedy: budget"):
        schedules.chen_greedy(bad, chain([1, 2, 3]))
