"""Worked solutions of labs/08_when_recompute_pays.ipynb, derived by hand from the roofline and
the FLOP counts of kernels/attn_*.cu (try the exercises first). tests/test_exercises.py holds
them to ckptlab's checkers."""

from math import ceil

A100_TENSOR16 = 312e12  # FLOP/s, dense BF16 on tensor cores (NVIDIA A100 datasheet)
A100_BANDWIDTH = 2.039e12  # bytes/s, A100 SXM 80GB


# Exercise 1. With launches one after another (the time model), recompute pays while d < 2 R / 3
# (section 1: stored's forward max(4 d, 4 R) + its backward max(8 d, 4 R) against flash's 14 d,
# S fp32 in bf16 too): A100 in bf16, ridge R = 312e12 / 2.039e12 = 153 FLOP/byte, so
# d < 2 x 153 / 3 = 102. Of 32, 64, 96, 128 the first above it is 128: there the recompute gain
# falls below 1 (the sweep: 0.94 with unique bytes; still 1.07 at d = 96). (With perfect
# overlap the rule would be 4 R / 7 = 87.4, and would wrongly give 96.)
ridge = A100_TENSOR16 / A100_BANDWIDTH
rule = 2 * ridge / 3  # 102.0
answer_1 = min(d for d in (32, 64, 96, 128) if d > rule)  # 128

# Exercise 2. Hardware FLOPs per (i, j) pair (whole tiles; N = 1024 divides them): forward S
# and P V, 4 d; dK/dV kernel S (recomputed), dP, dV, dK, 8 d; deterministic dQ kernel S and dP
# again and dQ, 6 d: 18 d per pair, over N^2 pairs. Bytes: the bf16 pair launch by launch, as
# lab 07's exercise 2 counts them, at the tiles both precisions share at d = 64: forward
# (Br, Bc) = (64, 32), backward (32, 32). "nd" counts elements of an (N, d) array at 2 bytes;
# "n" the floats of L or D, 4 bytes.
def flash_bytes_bf16(N: int, d: int) -> int:
    e, nd, n = 2, N * d, N
    Tr_fwd, Tc, Tr = ceil(N / 64), ceil(N / 32), ceil(N / 32)
    fwd = e * (nd + 2 * Tr_fwd * nd + nd) + 4 * n  # Q; K, V per Q tile; O; L
    pre = e * 2 * nd + 4 * n  # O, dO read; D written (no dQ to zero: deterministic)
    dkdv = e * (2 * Tc * nd + 2 * nd + 2 * nd) + 4 * 2 * Tc * n  # Q, dO per K/V tile; K, V;
    #                                                       dK, dV; L, D per K/V tile
    dq = e * (2 * nd + 2 * Tr * nd + nd) + 4 * 2 * n  # Q, dO; K, V per Q tile; dQ; L, D
    return fwd + pre + dkdv + dq


answer_2 = 18 * 64 * 1024**2 / flash_bytes_bf16(1024, 64)  # 53.2 FLOP per byte
