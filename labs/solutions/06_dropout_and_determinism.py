"""Worked solutions of labs/06_dropout_and_determinism.ipynb (try the exercises first).
tests/test_exercises.py holds them to ckptlab's checkers."""


# Exercise 1. rng.keep_mask returns a NumPy bool array: one byte per element of P's shape.
def mask_bytes(B: int, H: int, N: int) -> int:
    return B * H * N * N * 1


answer_1 = mask_bytes(64, 16, 1024)  # 1,073,741,824 bytes = 1 GiB (16 bytes of seed and offset)


# Exercise 2. Per (i, j) pair, 2 d FLOPs per matmul. Atomic: dkdv computes S, dP, dV, dK and dQ:
# 10 d. Deterministic: dkdv without dQ (8 d), then the dq kernel recomputes S and dP and
# computes dQ (6 d): 14 d. 14 / 10 = 1.4.
answer_2 = 14 / 10
