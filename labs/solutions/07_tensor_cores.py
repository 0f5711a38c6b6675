"""Worked solutions of labs/07_tensor_cores.ipynb, derived by hand from the headers of
kernels/wmma_gemm.cu and kernels/attn_flash_*.cu (try the exercises first).
tests/test_exercises.py holds them to ckptlab's checkers."""

from math import ceil
from pathlib import Path

T = 16  # the C tile of wmma_gemm.cu (and sgemm_tiled.cu)


# Exercise 1. sgemm_tiled's traffic with 2-byte inputs: A read once per 16-column tile of C,
# B once per 16-row tile; C, accumulated in fp32, written once at 4 bytes.
def wmma_gemm_bytes(M: int, N: int, K: int) -> int:
    return 2 * M * K * ceil(N / T) + 2 * K * N * ceil(M / T) + 4 * M * N


answer_1 = wmma_gemm_bytes(100, 40, 56)  # 80,960 bytes


# Exercise 2. Element counts of every launch of the flash pair, forward + deterministic
# backward, at N = 1024, d = 64 with the tiles both precisions share there: forward
# (Br, Bc) = (64, 32), backward (32, 32). "nd" counts elements of an (N, d) array, moved at the
# element size e (4 fp32, 2 bf16); "n" counts floats of L or D, always 4 bytes.
def flash_bytes(N: int, d: int, e: int) -> int:
    nd, n = N * d, N
    Tr_fwd, Tc, Tr = ceil(N / 64), ceil(N / 32), ceil(N / 32)
    fwd = e * (nd + 2 * Tr_fwd * nd + nd) + 4 * n  # Q; K, V per Q tile; O; L
    pre = e * 2 * nd + 4 * n  # O, dO read; D written (no dQ to zero: deterministic)
    dkdv = e * (2 * Tc * nd + 2 * nd + 2 * nd) + 4 * 2 * Tc * n  # Q, dO per K/V tile; K, V;
    #                                                       dK, dV; L, D per K/V tile
    dq = e * (2 * nd + 2 * Tr * nd + nd) + 4 * 2 * n  # Q, dO; K, V per Q tile; dQ; L, D
    return fwd + pre + dkdv + dq


answer_2 = flash_bytes(1024, 64, 2) / flash_bytes(1024, 64, 4)  # 0.5031: L and D stay fp32

# Exercise 3. The kernel you write is the lab's own: labs/exercises/wmma_tile.cu is
# kernels/wmma_gemm.cu with the lesson's lines cut out, so the solution is that file
# (`python -m ckptlab exercise solution wmma_tile` shows just the lines you write).
answer_3 = str(Path(__file__).resolve().parents[2] / "kernels" / "wmma_gemm.cu")
