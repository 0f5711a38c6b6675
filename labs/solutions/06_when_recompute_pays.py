"""Worked solutions of labs/06_when_recompute_pays.ipynb, derived by hand from the roofline and
the FLOP counts of kernels/attn_*.cu (try the exercises first). tests/test_exercises.py holds
them to ckptlab's checkers."""

A100_TENSOR16 = 312e12  # FLOP/s, dense BF16 on tensor cores (NVIDIA A100 datasheet)
A100_BANDWIDTH = 2.039e12  # bytes/s, A100 SXM 80GB


# Exercise 1. With launches one after another (the time model), recompute pays while d < 2 R / 3
# (section 1: stored's forward max(4 d, 4 R) + its backward max(8 d, 4 R) against flash's 14 d,
# S fp32 in bf16 too): A100 in bf16, ridge R = 312e12 / 2.039e12 = 153 FLOP/byte, so
# d < 2 x 153 / 3 = 102. Of 16, 32, 64, 128 the first above it is 128: there the recompute gain
# falls below 1 (the sweep: 0.94 with unique bytes; still 1.46 at d = 64). (With perfect
# overlap the rule would be 4 R / 7 = 87.4: the same answer on this sweep.)
ridge = A100_TENSOR16 / A100_BANDWIDTH
rule = 2 * ridge / 3  # 102.0
answer_1 = min(d for d in (16, 32, 64, 128) if d > rule)  # 128

# Exercise 2. Per (i, j) pair: model FLOPs 4 d (forward) + 8 d (backward) = 12 d; hardware FLOPs
# 4 d + 10 d (the backward also recomputes S, 2 d) = 14 d (the tiles divide N = 1024 and d = 64:
# no padding). At the same time HFU / MFU = 14 / 12.
answer_2 = 14 / 12
