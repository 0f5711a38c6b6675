"""Worked solutions of labs/10_schedules_and_budgets.ipynb (try the exercises first).
tests/test_exercises.py holds them to ckptlab's checkers, on the notebook's own chain."""

import numpy as np

from ckptlab import models
from ckptlab.recompute.checkpoint import Seg


def notebook_profile():
    """The GPT the notebook profiles (8 blocks, naive attention, dropout)."""
    gpt = models.GPT(vocab=64, ctx=32, width=32, heads=2, layers=8, dropout=0.1, attn="naive",
                     seed=0)
    gen = np.random.default_rng(0)
    x, y = gen.integers(0, 64, size=(2, 32)), gen.integers(0, 64, size=(2, 32))
    return gpt.profile(x, y, policies=["matmul"], recompute=[{"attention"}])


# Exercise 1. sqrt recomputes all 8 blocks once. The last blocks are freed first in the
# backward, so keeping them plain costs memory only until the backward begins, when the
# checkpointed segments are still unrecomputed. Keep blocks 6 and 7 plain and checkpoint the
# first six in pairs: 3 segment inputs + 2 blocks held at the end of the forward, one 2-block
# segment during each recompute: 29% of the plain peak, recomputing 6 blocks instead of 8
# (the DP finds the same plan).
answer_1 = [Seg([0, 1]), Seg([2, 3]), Seg([4, 5]), 6, 7]

# Exercise 2. With one snapshot, reversing block k reruns blocks 0 .. k-1 from the input:
# 0 + 1 + ... + 9 = 10 * 9 / 2 = 45 block forwards (revolve_cost(10, 1)).
answer_2 = 10 * 9 // 2
