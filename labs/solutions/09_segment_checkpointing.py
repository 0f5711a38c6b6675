"""Worked solutions of labs/09_segment_checkpointing.ipynb (try the exercises first).
tests/test_exercises.py holds them to ckptlab's checkers, on the notebook's own chain."""

from math import sqrt
from pathlib import Path

import numpy as np

from ckptlab import device, models
from ckptlab.recompute import schedules

L, BATCH, WIDTH, HIDDEN = 32, 16, 32, 128  # the notebook's MLP (hidden = 4 x width)
F64 = 8  # bytes: the MLP runs in float64


def notebook_profile():
    """The chain the notebook profiles (its bytes depend on the shapes, not on the values),
    on the host's arrays whatever GPU is detected (this file is loaded at import time)."""
    with device.use("emu"):
        mlp = models.MLP(width=WIDTH, layers=L, dropout=0.1, seed=0)
        gen = np.random.default_rng(0)
        x, y = gen.standard_normal((BATCH, WIDTH)), gen.integers(0, 8, size=BATCH)
        return mlp.profile(x, y)


# Exercise 1. A block x + dropout(relu(x W1 + b1) W2 + b2) keeps its input x for the first matmul
# (16 x 32 float64 = 4096 bytes), relu's output for the second (16 x 128 = 16384; relu's own
# backward uses it too) and dropout's boolean mask (16 x 32 = 512): a = 20992 bytes, x = 4096.
# Peak(k) ~ k x + (L / k) a is least at k = sqrt(L a / x) = sqrt(32 * 5.125) = 12.8: about 13
# segments, not sqrt(32) = 6, because a block saves five times its input.
# That estimate points near the optimum; the exact least comes from the schedule's own
# predictions for the k around it (segments of unequal length and the head shift it): k = 16.
x_bytes = BATCH * WIDTH * F64
a_bytes = x_bytes + BATCH * HIDDEN * F64 + BATCH * WIDTH * 1
estimate = round(sqrt(L * a_bytes / x_bytes))  # 13


def least_peak_k(prof):
    """The k whose uniform(L, k) plan the profile predicts to peak least (the first, on ties)."""
    return min(range(1, L + 1), key=lambda k: schedules.uniform(L, k).predict(prof).peak_bytes)


answer_1 = least_peak_k(notebook_profile())  # 16

# Exercise 2. Model FLOPs = forward F + backward B, with B ~ 2 F (each matmul's backward is two
# matmuls). sqrt recomputes every block's forward once: hardware = 2 F + B, so
# hardware / model = (2 F + B) / (F + B) = 4 / 3.
answer_2 = 4 / 3

# Exercise 3. checkpoint() by hand: labs/solutions/checkpoint.py, the file the exercise
# labs/exercises/checkpoint.py is cut from.
answer_3 = str(Path(__file__).resolve().parent / "checkpoint.py")
