"""Worked solutions of labs/08_schedules_and_budgets.ipynb (try the exercises first).
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

# Exercise 2. s b h (34 + 5 a s / h) = 2048 * 12288 * (34 + 5 * 96 * 2048 / 12288)
#           = 2048 * 12288 * (34 + 80) = 2,868,903,936 bytes, 2.7 GiB per layer (256 GiB for 96).
answer_2 = 2048 * 1 * 12288 * (34 + 5 * 96 * 2048 // 12288)

# Exercise 3. Selective recompute drops the 5 a s / h = 80 part: 80 / 114 = 0.70.
answer_3 = 80 / 114
