"""Worked solutions of labs/06_dropout_and_determinism.ipynb (try the exercises first).
tests/test_exercises.py holds them to ckptlab's checkers."""

from pathlib import Path


# Exercise 1. rng.keep_mask returns a NumPy bool array: one byte per element of P's shape.
def mask_bytes(B: int, H: int, N: int) -> int:
    return B * H * N * N * 1


answer_1 = mask_bytes(64, 16, 1024)  # 1,073,741,824 bytes = 1 GiB (16 bytes of seed and offset)


# Exercise 2. Per (i, j) pair, 2 d FLOPs per matmul. Atomic: dkdv computes S, dP, dV, dK and dQ:
# 10 d. Deterministic: dkdv without dQ (8 d), then the dq kernel recomputes S and dP and
# computes dQ (6 d): 14 d. 14 / 10 = 1.4.
answer_2 = 14 / 10

# Exercise 3. The kernel you write is the lab's own: labs/exercises/dropout_backward.cu is
# kernels/attn_flash_bwd.cu with the lesson's lines cut out, so the solution is that file
# (`python -m ckptlab exercise solution dropout_backward` shows just the lines you write).
answer_3 = str(Path(__file__).resolve().parents[2] / "kernels" / "attn_flash_bwd.cu")
