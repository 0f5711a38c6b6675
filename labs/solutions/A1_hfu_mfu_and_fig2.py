"""Worked solutions of labs/A1_hfu_mfu_and_fig2.ipynb, derived by hand from the FLOP counts of
kernels/attn_*.cu (try the exercises first). tests/test_exercises.py holds them to ckptlab's
checkers."""

B, H, N, D = 64, 16, 1024, 64  # GPT-2 medium's attention in Fig. 2

# Exercise 1. Per (i, j) pair: model FLOPs 4 d (forward) + 8 d (backward) = 12 d; hardware FLOPs
# 4 d + 10 d (the backward also recomputes S, 2 d) = 14 d (the tiles divide N = 1024 and d = 64:
# no padding). At the same time HFU / MFU = 14 / 12.
answer_1 = 14 / 12

# Exercise 2. Standard attention's matmuls, per (i, j) pair: forward S = Q K^T and O = P V,
# 2 d each; backward dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q, 2 d each: 12 d. Over
# N^2 pairs per head, B H heads: 12 * 64 * 1024^2 * 64 * 16 = 824.6 GFLOPs (the paper's 66.6 is
# N^2 B (12 d + 224) / 1e9, one head's).
answer_2 = 12 * D * N * N * B * H / 1e9
