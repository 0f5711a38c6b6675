"""One tensor-core tile: the wmma calls of kernels/wmma_gemm.cu (lab 07). The warp stages a
16 x 16 tile of A and of B in shared memory (given); the learner loads them into fragments,
multiplies and accumulates, and stores the accumulator.

Checked in both 16-bit types, float16 and bfloat16, at sizes with a k-loop of several tiles
and with tails in M, N and K. The truth is the float64 product of the 16-bit inputs as stored:
their products are exact in fp32 (at most 11 significant bits each), so only the fp32 sums
round.
"""

from __future__ import annotations

import zlib

import numpy as np

from ckptlab import device
from ckptlab.exercises.write.slips import WMMA_SLIPS
from ckptlab.exercises.write.spec import Case, Exercise, Output, StepText, fixed_normal
from ckptlab.kernels import wmma as wmma_kernels
from ckptlab.kernels.common import ceil_div
from ckptlab.kernels.table import WARP, WMMA_TILE
from ckptlab.measure import traffic

CTYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16"}


def _dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes  # imported only for bf16: it is slow to import

        return ml_dtypes.bfloat16
    return np.float16


def _case(label, phrase, M, N, K, dtype="bfloat16"):
    return Case(label, phrase, dict(M=M, N=N, K=K), dict(dtype=dtype),
                seed=zlib.crc32(label.encode()) % 10_000)


def inputs(case):
    s, dt = case.sizes, _dtype(case.options["dtype"])
    A, B = fixed_normal(case.seed, (s["M"], s["K"]), (s["K"], s["N"]))
    return {"A": A.astype(dt), "B": B.astype(dt)}


def run(case, arrays):
    s, xp = case.sizes, device.xp()
    A, B = xp.asarray(arrays["A"]), xp.asarray(arrays["B"])
    C = xp.full((s["M"], s["N"]), np.nan, dtype=np.float32)  # (M, N), NaN until written
    f = wmma_kernels.gemm(arrays["A"].dtype)
    T = WMMA_TILE
    f((ceil_div(s["N"], T), ceil_div(s["M"], T)), (WARP,),
      (A, B, C, np.int32(s["M"]), np.int32(s["N"]), np.int32(s["K"])))
    return {"C": C}


def truth(case, arrays):
    return {"C": arrays["A"].astype(np.float64) @ arrays["B"].astype(np.float64)}


def transposed_tiles(case, arrays):
    """C with every 16 x 16 tile stored transposed (the accumulator stored column-major into a
    row-major tile); the tiles past M and N hold zeros, as the zero-padded staging makes them."""
    C = truth(case, arrays)["C"]
    M, N = C.shape
    T = WMMA_TILE
    Mp, Np = ceil_div(M, T) * T, ceil_div(N, T) * T
    padded = np.zeros((Mp, Np))
    padded[:M, :N] = C
    tiles = padded.reshape(Mp // T, T, Np // T, T).transpose(0, 3, 2, 1)
    return {"C": tiles.reshape(Mp, Np)[:M, :N]}


WMMA_TILE_EXERCISE = Exercise(
    name="wmma_tile", lab="07", title="one tile of a 16-bit matmul on tensor cores (wmma)",
    kernel="wmma_gemm.cu",
    intro=("One warp computes one 16 x 16 tile of C = A B. For each k-tile the warp has staged",
           "As (16 x KT) and Bs (KT x 16), row-major, in shared memory; you load them into the",
           "fragments a and b, multiply-accumulate into acc, and at the end store acc to Cs."),
    steps={
        1: StepText(("wmma::load_matrix_sync(fragment, pointer to the tile's first element,",
                     "leading dimension): the leading dimension is the row length of the tile",
                     "in shared memory (As is 16 x KT, Bs is KT x 16)."), ()),
        2: StepText(("wmma::mma_sync(d, a, b, c) computes d = a b + c; accumulate into acc."), ()),
        3: StepText(("wmma::store_matrix_sync(pointer, fragment, leading dimension, layout):",
                     "Cs is 16 x 16, row-major (wmma::mem_row_major)."), ()),
    },
    outputs=(Output("C", ("r", "c"), {"r": WMMA_TILE, "c": WMMA_TILE}),),
    cases=(
        _case("base", "the base case (bfloat16)", 32, 32, 48),
        _case("one_tile", "a single k-tile (K = 16)", 32, 32, 16),
        _case("tail", "M, N and K not multiples of 16", 37, 29, 45),
        _case("float16", "float16 inputs", 32, 32, 48, dtype="float16"),
    ),
    inputs=inputs, run=run, truth=truth,
    alternatives={"tile_transposed": ("A B with every 16 x 16 tile transposed",
                                      transposed_tiles), **WMMA_SLIPS},
    traffic=lambda case: [traffic.wmma_gemm(case.sizes["M"], case.sizes["N"], case.sizes["K"],
                                            CTYPES[case.options["dtype"]])],
    kernels=tuple(f"wmma_gemm<{c}>" for c in CTYPES.values()),
    picture=("wmma_gemm", ("C",)),
    hints={
        "tile_transposed": (
            "Every tile of C comes out transposed. In which layout does the accumulator go "
            "into Cs, and in which is Cs read?",
            "Step 3: Cs is read row-major (Cs[r][c]); store_matrix_sync must write it with "
            "wmma::mem_row_major and a leading dimension of 16."),
        "multi_tile": (
            "C is right with one k-tile and wrong with several. What happens to the "
            "accumulator from one k-tile to the next?",
            "Step 2: mma_sync(acc, a, b, acc) adds this k-tile's product to acc; passing a "
            "zeroed or fresh fragment as c keeps only the last k-tile."),
        "everywhere": (
            "C is wrong everywhere. Is each fragment loaded with the leading dimension of its "
            "own tile?",
            "Step 1: As rows are KT long, Bs rows 16; a wrong leading dimension reads the tile "
            "with another shape."),
    },
)
