"""Worked solutions of labs/03_store_p_backward.ipynb (try the exercises first).
tests/test_exercises.py holds them to ckptlab's checkers."""

from math import ceil
from pathlib import Path

import numpy as np

BYTES = 4  # fp32
T = 16  # NAIVE_TILE


# Exercise 1. dP_ij/dS_ik = P_ij (delta_jk - P_ik), so dS_ik = sum_j dP_ij P_ij (delta_jk - P_ik)
# = P_ik (dP_ik - D_i) with D_i = sum_j P_ij dP_ij.
def softmax_backward(P, dP):
    D = (P * dP).sum(axis=1, keepdims=True)  # (Nq, 1)
    return P * (dP - D)  # (Nq, Nk)


# Exercise 2. Two launches take P: attn_naive_bwd_dv computes dV = P^T dO as a tiled matmul with
# 16 x 16 output tiles, so P is read once per column tile of dV, ceil(d / 16) times; and
# attn_naive_bwd_ds reads it twice (pass 1 for D, pass 2 for dS).
def store_p_reads(B: int, H: int, N: int, d: int) -> int:
    return BYTES * B * H * N * N * (ceil(d / T) + 2)


answer_2 = store_p_reads(1, 2, 100, 32)  # 320,000 bytes


def _self_check():
    """dS rows sum to zero: shifting a row of S does not change P."""
    g = np.random.default_rng(0)
    S = g.standard_normal((3, 5))
    P = np.exp(S) / np.exp(S).sum(axis=1, keepdims=True)
    return np.allclose(softmax_backward(P, g.standard_normal((3, 5))).sum(axis=1), 0)

# Exercise 3. The kernel you write is the lab's own: labs/exercises/naive_ds.cu is
# kernels/attn_naive_bwd.cu with the lesson's lines cut out, so the solution is that file
# (`python -m ckptlab exercise solution naive_ds` shows just the lines you write).
answer_3 = str(Path(__file__).resolve().parents[2] / "kernels" / "attn_naive_bwd.cu")
