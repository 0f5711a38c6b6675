"""Worked solutions of labs/04_flash_forward.ipynb (try the exercises first).
tests/test_exercises.py holds them to ckptlab's checkers."""

from pathlib import Path

import numpy as np

BYTES = 4  # fp32
LANES = 8  # threads per query row in the flash kernels
SHARED_LIMIT = 48 * 1024  # static shared memory per block


# Exercise 1. Both states must be brought to the common max m = max(m_a, m_b): the sum l_a was
# taken of exp(x - m_a), so it becomes l_a exp(m_a - m); likewise l_b. Both exponents are <= 0,
# and an empty part (m = -inf, l = 0) next to a non-empty one contributes 0 * exp(-inf) = 0.
# When both are empty (a fully masked row), m = -inf and exp(m_a - m) = exp(-inf + inf) = NaN:
# an empty part is weighted 0 explicitly, as kernels/softmax_rows.cu does.
def merge(m_a, l_a, m_b, l_b):
    m = np.maximum(m_a, m_b)
    with np.errstate(invalid="ignore"):  # exp(nan) where a part is empty; np.where drops it
        part_a = np.where(l_a > 0, l_a * np.exp(m_a - m), 0.0)
        part_b = np.where(l_b > 0, l_b * np.exp(m_b - m), 0.0)
    return m, part_a + part_b


# Exercise 2. The forward's tiles, padded by one column where rows are read across lanes:
# Qs[Br][d+1], Ks[Bc][d+1], Vs[Bc][d], Ps[Br][Bc+1], 4 bytes each:
#   4 (Br (d + 1) + Bc (d + 1) + Bc d + Br (Bc + 1)) <= 49152
#   Br <= (12288 - Bc (2d + 1)) / (d + Bc + 2) = (12288 - 4112) / 146 = 56.0 at d = 128, Bc = 16
def flash_tile_rows(d: int, Bc: int) -> int:
    br = (SHARED_LIMIT // BYTES - Bc * (2 * d + 1)) // (d + Bc + 2)
    return br - br % LANES


answer_2 = flash_tile_rows(128, 16)  # 56


# Exercise 3. O (B, H, N, d) and L (B, H, N), fp32: (d + 1) numbers per query row.
def flash_saved_bytes(B: int, H: int, N: int, d: int) -> int:
    return BYTES * B * H * N * (d + 1)


answer_3 = flash_saved_bytes(64, 16, 1024, 64)  # 272,629,760 bytes = 260 MiB, vs 4 GiB for P

# Exercise 4. The kernel you write is the lab's own: labs/exercises/flash_forward.cu is
# kernels/attn_flash_fwd.cu with the lesson's lines cut out, so the solution is that file
# (`python -m ckptlab exercise solution flash_forward` shows just the lines you write).
answer_4 = str(Path(__file__).resolve().parents[2] / "kernels" / "attn_flash_fwd.cu")

# Exercise 5. The from-scratch file gives the signature, launch and shared memory of the lab's
# own kernel, so the lab's kernel file is a solution of it too (`python -m ckptlab exercise
# solution scratch/flash_forward` shows its body).
answer_5 = answer_4
