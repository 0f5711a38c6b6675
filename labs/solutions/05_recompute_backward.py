"""Worked solutions of labs/05_recompute_backward.ipynb, derived by hand from the headers of
kernels/attn_*.cu (try the exercises first). tests/test_exercises.py holds them
to ckptlab's checkers."""

from pathlib import Path

BYTES = 4  # fp32


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


answer_2 = recompute_bytes_saved(1, 1, 300, 64)  # 720,000 bytes (d does not enter)

# Exercise 3. The kernel you write is the lab's own: labs/exercises/flash_backward.cu is
# kernels/attn_flash_bwd.cu with the lesson's lines cut out, so the solution is that file
# (`python -m ckptlab exercise solution flash_backward` shows just the lines you write).
answer_3 = str(Path(__file__).resolve().parents[2] / "kernels" / "attn_flash_bwd.cu")

# Exercise 4. The from-scratch file gives the signatures, launches and shared memory of the
# lab's own kernels, so the lab's kernel file is a solution of it too (`python -m ckptlab
# exercise solution scratch/flash_backward` shows the two bodies).
answer_4 = answer_3
