"""Worked solutions of labs/02_naive_attention.ipynb, derived by hand from the header of
kernels/attn_naive_fwd.cu (try the exercises first). tests/test_exercises.py holds them to
ckptlab's checkers."""

from math import ceil
from pathlib import Path

BYTES = 4  # fp32
T = 16  # NAIVE_TILE: the naive matmuls' output tile


# Exercise 1. Per (b, h), in units of N^2 numbers: the scores kernel writes S (1); the softmax
# reads S twice (a pass for the row max and sum, a pass to write P) and writes P (2 + 1); P V
# reads P once for every 16-wide column tile of O, ceil(d / 16) times.
def naive_nn_bytes(B: int, H: int, N: int, d: int) -> int:
    return BYTES * B * H * N * N * (1 + 2 + 1 + ceil(d / T))


answer_1 = naive_nn_bytes(1, 2, 100, 32)  # 480,000 bytes


# Exercise 2. Only P (B, H, N, N) is kept; S is a temporary.
def naive_saved_bytes(B: int, H: int, N: int, d: int) -> int:
    return BYTES * B * H * N * N


answer_2 = naive_saved_bytes(64, 16, 1024, 64)  # 4,294,967,296 bytes = 4 GiB


# Exercise 3. S, P, dP and dS are N x N, and the matmuls re-read Q, K, V, dO once per 16-wide
# tile of the other side (N^2 d / 16): every large term is N^2, so p = 2.
answer_3 = 2

# Exercise 4. The kernel you write is the lab's own: labs/exercises/naive_softmax.cu is
# kernels/attn_naive_fwd.cu with the lesson's lines cut out, so the solution is that file
# (`python -m ckptlab exercise solution naive_softmax` shows just the lines you write).
answer_4 = str(Path(__file__).resolve().parents[2] / "kernels" / "attn_naive_fwd.cu")
