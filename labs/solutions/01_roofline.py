"""Worked solutions of labs/01_roofline.ipynb, derived by hand from kernels/sgemm_tiled.cu,
kernels/softmax_rows.cu and the GPUs' datasheet numbers (try the exercises first).

Each answer is a formula of the exercise's sizes, so other sizes can be tried too; `answer_k` is
the value at the notebook's sizes. tests/test_exercises.py holds them to ckptlab's checkers.
"""

from math import ceil
from pathlib import Path

from ckptlab.exercises.lab01 import racy_sgemm_source  # the exercise's input, not its answer

BYTES = 4  # fp32
TILE = 16  # TILE in kernels/sgemm_tiled.cu


# Exercise 1. One block computes a 16 x 16 tile of C. For each 16-wide k-tile it loads a 16 x 16
# tile of A (its rows) and one of B (its columns); elements past the edges are not loaded. So
# each element of A is loaded once by every block in its block-row: ceil(N / 16) times; each
# element of B once by every block in its block-column: ceil(M / 16) times; C is written once.
def sgemm_bytes(M: int, N: int, K: int) -> int:
    return BYTES * (M * K * ceil(N / TILE) + K * N * ceil(M / TILE) + M * N)


answer_1 = sgemm_bytes(40, 24, 56)  # 37,888 bytes (A 17,920 + B 16,128 + C 3,840)


# Exercise 2. softmax_rows reads x twice (pass 1: online max and sum; pass 2: the output) and
# writes y once: 12 R C bytes for 5 R C FLOPs. The sizes cancel.
def softmax_intensity(R: int, C: int) -> float:
    return 5 * R * C / (BYTES * 3 * R * C)


answer_2 = softmax_intensity(4096, 4096)  # 5 / 12 = 0.417 FLOP/byte


# Exercise 3. At M = N = K = n the intensity is 2 n^3 / (4 (2 n^2 ceil(n/T) + n^2)), about T / 4
# FLOP/byte. The A100's fp32 ridge is 19.5 TFLOP/s / 2039 GB/s = 9.56 FLOP/byte (datasheet), so
# T >= 4 * 9.56 = 38.3: T = 39. Checked with the ceilings: at T = 39, ceil(4096/39) = 106 gives
# 9.62 >= 9.56; at T = 38, ceil(4096/38) = 108 gives 9.44 < 9.56.
def sgemm_intensity(n: int, T: int) -> float:
    return 2 * n**3 / (BYTES * (2 * n * n * ceil(n / T) + n * n))


A100_RIDGE = 19.5e12 / 2039e9  # FLOP/byte, from the A100 80GB SXM datasheet
answer_3 = next(T for T in range(1, 4097) if sgemm_intensity(4096, T) >= A100_RIDGE)  # 39


# Exercise 4. Memory-bound time is bytes / bandwidth; the FLOPs may grow until FLOPs / peak
# reaches it, i.e. until the intensity reaches the ridge: factor = ridge / intensity. The H100
# SXM's fp32 ridge is 67 TFLOP/s / 3350 GB/s = 20 FLOP/byte; 20 / (5/12) = 48.
H100_RIDGE = 67e12 / 3350e9
answer_4 = H100_RIDGE / softmax_intensity(4096, 4096)  # 48


# Exercise 5. Without the second barrier a thread that finishes its inner loop early goes on to
# the next k-tile and overwrites As and Bs while slower threads of its block still read them.
# The barrier after the inner loop makes every thread finish reading before anyone writes.
def fix_race(racy: str) -> str:
    return racy.replace("// (a barrier was here)",
                        "__syncthreads();  // all reads of this k-tile done before the next")


answer_5 = fix_race(racy_sgemm_source())  # the notebook's `racy`, from the same function


# Exercise 6. __shared__ float As[TILE][TILE] and Bs[TILE][TILE]: 2 * 32 * 32 * 4 bytes at
# TILE = 32 (ptxas reports the same, 8192: no other shared memory in the kernel).
def sgemm_shared_bytes(tile: int) -> int:
    return 2 * tile * tile * BYTES


answer_6 = sgemm_shared_bytes(32)  # 8192

# Exercise 7. The kernel you write is the lab's own: labs/exercises/row_softmax.cu is
# kernels/softmax_rows.cu with the lesson's lines cut out, so the solution is that file
# (`python -m ckptlab exercise solution row_softmax` shows just the lines you write).
answer_7 = str(Path(__file__).resolve().parents[2] / "kernels" / "softmax_rows.cu")
