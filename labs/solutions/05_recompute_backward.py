"""Worked solutions of labs/05_recompute_backward.ipynb, derived by hand from the headers of
kernels/attn_*.cu (try the exercises first). tests/test_exercises.py holds them to ckptlab's
checkers."""

from math import ceil

BYTES = 4  # fp32
T = 16  # NAIVE_TILE
FWD_TILES = {64: (64, 32)}  # (Br, Bc) of attn_flash_fwd at d = 64
BWD_TILES = {64: (32, 32)}  # (Br, Bc) of attn_flash_bwd_dkdv at d = 64


# Exercise 1. Only S = scale Q K^T is recomputed (P = exp(S - L) is pointwise): N x N dot
# products of length d per (b, h), 2 FLOPs per multiply-add.
def recompute_flops(B: int, H: int, N: int, d: int) -> int:
    return 2 * B * H * N * N * d


answer_1 = recompute_flops(1, 2, 100, 32)  # 1,280,000 FLOPs


# Exercise 2. Every launch's bytes per (b, h), in numbers (x 4 bytes); c = ceil(N / 16),
# e = ceil(d / 16).
def naive_bytes(N: int, d: int) -> int:
    c, e, nn, nd = ceil(N / T), ceil(d / T), N * N, N * d
    fwd = (2 * nd * c + nn) + (2 * nn + nn) + (nn * e + nd * c + nd)  # scores, softmax, P V
    bwd = ((nn * e + nd * c + nd)  # dV = P^T dO
           + (2 * nd * c + nn)  # dP = dO V^T
           + (4 * nn + nn)  # dS: P and dP read twice each, dS written
           + 2 * (nn * e + nd * c + nd))  # dQ = dS K, dK = dS^T Q
    return BYTES * (fwd + bwd)


def flash_bytes(N: int, d: int) -> int:
    Br, _ = FWD_TILES[d]
    _, Bc = BWD_TILES[d]
    Tr, Tc, nd = ceil(N / Br), ceil(N / Bc), N * d
    fwd = nd + 2 * Tr * nd + nd + N  # Q once, K and V once per Q tile, O and L written
    pre = 2 * nd + N + nd  # O, dO read; D written; dQ zeroed for the atomics
    dkdv = (2 * Tc * nd + 2 * nd + 2 * Tc * N  # Q, dO per K/V tile; K, V once; L, D per tile
            + 2 * nd + Tc * nd)  # dK, dV written; one atomicAdd (4 bytes) per dQ element a tile
    return BYTES * (fwd + pre + dkdv)


answer_2 = naive_bytes(1024, 64) / flash_bytes(1024, 64)  # 6.74 (B and H cancel)


# Exercise 3. Per (i, j) pair: model FLOPs 4 d (forward) + 8 d (backward) = 12 d; hardware FLOPs
# 4 d + 10 d (the backward also recomputes S, 2 d) = 14 d. At the same time HFU / MFU = 14 / 12.
answer_3 = 14 / 12
