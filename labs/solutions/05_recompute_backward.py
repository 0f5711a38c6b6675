"""Worked solutions of labs/05_recompute_backward.ipynb, derived by hand from the headers of
kernels/attn_*.cu and the roofline (try the exercises first). tests/test_exercises.py holds them
to ckptlab's checkers."""

BYTES = 4  # fp32
A100_TENSOR16 = 312e12  # FLOP/s, dense BF16 on tensor cores (NVIDIA A100 datasheet)
A100_BANDWIDTH = 2.039e12  # bytes/s, A100 SXM 80GB


# Exercise 1. Only S = scale Q K^T is recomputed (P = exp(S - L) is pointwise): N x N dot
# products of length d per (b, h), 2 FLOPs per multiply-add.
def recompute_flops(B: int, H: int, N: int, d: int) -> int:
    return 2 * B * H * N * N * d


answer_1 = recompute_flops(1, 2, 100, 32)  # 1,280,000 FLOPs


# Exercise 2. Stored and flash run the same kernels but for where P comes from. Stored's forward
# writes S, one float per (i, j), and its dK/dV kernel reads it back once; flash does neither.
# Everything else (Q, K, V, O, L, dO, D, dQ, dK, dV) moves the same way in both.
def recompute_bytes_saved(B: int, H: int, N: int, d: int) -> int:
    return 2 * BYTES * B * H * N * N  # written once + read once


answer_2 = recompute_bytes_saved(1, 1, 256, 64)  # 524,288 bytes (d does not enter)


# Exercise 3. With launches one after another (the time model), recompute pays while d < 2 R / 3
# (section 1: stored's forward max(4 d, 4 R) + its backward max(8 d, 4 R) against flash's 14 d,
# S fp32 in bf16 too): A100 in bf16, ridge R = 312e12 / 2.039e12 = 153 FLOP/byte, so
# d < 2 x 153 / 3 = 102. Of 16, 32, 64, 128 the first above it is 128: there the recompute gain
# falls below 1 (the sweep: 0.94 with unique bytes; still 1.46 at d = 64). (With perfect
# overlap the rule would be 4 R / 7 = 87.4: the same answer on this sweep.)
ridge = A100_TENSOR16 / A100_BANDWIDTH
rule = 2 * ridge / 3  # 102.0
answer_3 = min(d for d in (16, 32, 64, 128) if d > rule)  # 128

# Exercise 4. Per (i, j) pair: model FLOPs 4 d (forward) + 8 d (backward) = 12 d; hardware FLOPs
# 4 d + 10 d (the backward also recomputes S, 2 d) = 14 d (the tiles divide N = 1024 and d = 64:
# no padding). At the same time HFU / MFU = 14 / 12.
answer_4 = 14 / 12
