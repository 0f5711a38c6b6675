"""One tensor-core tile: the wmma calls of kernels/wmma_gemm.cu (lab 07). The warp stages a
16 x 16 tile of A and of B in shared memory (given); the learner loads them into fragments,
multiplies and accumulates, and stores the accumulator.

Checked in every type the file is instantiated for (table.instantiations: bfloat16 first,
then float16 and tf32, whose tiles are m16n16k8), at sizes with a k-loop of several tiles and
with tails in M, N and K. The truth is the float64 product of the inputs as the tensor core
reads them: the 16-bit inputs as stored, tf32 inputs rounded to 11 significant bits as the
kernel's __float_to_tf32 does (to nearest, ties away from zero). Their products are exact in
fp32, so only the fp32 sums round.
"""

from __future__ import annotations

import zlib

import numpy as np

from ckptlab import device
from ckptlab.exercises.write.slips import WMMA_SLIPS
from ckptlab.exercises.write.spec import (
    Case,
    Exercise,
    Output,
    StepText,
    Variant,
    fixed_normal,
    with_variants,
)
from ckptlab.kernels import wmma as wmma_kernels
from ckptlab.kernels.common import ceil_div
from ckptlab.kernels.table import WARP, WMMA_TILE, instantiations
from ckptlab.measure import traffic

# the case option `dtype` -> the C type T of wmma_gemm<T> it runs (tf32: fp32 arrays)
CTYPES = {"bfloat16": "__nv_bfloat16", "float16": "__half", "tf32": "float"}
DEFAULT = "bfloat16"
PHRASES = {"float16": "float16 inputs", "tf32": "tf32 inputs (fp32 arrays, m16n16k8 tiles: "
           "KT = 8)"}


def _dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes  # imported only for bf16: it is slow to import

        return ml_dtypes.bfloat16
    return {"float16": np.float16, "tf32": np.float32}[name]


def _case(label, phrase, M, N, K, dtype=DEFAULT):
    return Case(label, phrase, dict(M=M, N=N, K=K), dict(dtype=dtype),
                seed=zlib.crc32(label.encode()) % 10_000)


def variants() -> tuple:
    """A Variant for every type but the default that the wrappers instantiate the file for
    (table.instantiations, the list `python -m ckptlab kernels` compiles). tf32 skips
    "one_tile": with k-tiles of 8, K = 16 is two of them."""
    by_ctype = {c: name for name, c in CTYPES.items()}
    out = []
    for kernel in instantiations("wmma_gemm.cu"):
        name = by_ctype[kernel[kernel.index("<") + 1:-1]]
        if name != DEFAULT:
            only = ("base", "tail") if name == "tf32" else ()
            out.append(Variant(name, PHRASES[name], {"dtype": name}, only))
    return tuple(out)


def rna_tf32(x: np.ndarray) -> np.ndarray:
    """x rounded to tf32 (11 significant bits, to nearest, ties away from zero), in float64:
    what __float_to_tf32 gives."""
    m, e = np.frexp(np.asarray(x, np.float64))
    return np.ldexp(np.sign(m) * np.floor(np.abs(m) * 2048 + 0.5), e - 11)


def inputs(case):
    s, dt = case.sizes, _dtype(case.options["dtype"])
    A, B = fixed_normal(case.seed, (s["M"], s["K"]), (s["K"], s["N"]))
    return {"A": A.astype(dt), "B": B.astype(dt)}


def _read(a: np.ndarray) -> np.ndarray:
    """An input as the tensor core multiplies it, in float64 (fp32 arrays: rounded to tf32)."""
    return rna_tf32(a) if a.dtype == np.float32 else a.astype(np.float64)


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
    return {"C": _read(arrays["A"]) @ _read(arrays["B"])}


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
        1: StepText(("Load the staged tiles into the fragments, the whole warp together",
                     "(wmma::load_matrix_sync, one call per fragment): A's 16 x KT tile As into a,",
                     "B's KT x 16 tile Bs into b. Each load needs where the tile starts in shared",
                     "memory and its leading dimension: the distance, in elements, from one row to",
                     "the next, i.e. the row length of that tile as declared. As and Bs differ,",
                     "and KT is 16 for the 16-bit types but 8 in the tf32 instantiation of the",
                     "same file."),
                    ()),
        2: StepText(("One tensor-core multiply-accumulate of the tile pair, the whole warp",
                     "together (wmma::mma_sync): acc becomes a b + acc. acc carries the sum over",
                     "the k-tiles: it was zero-filled before the loop, and each k-tile's product",
                     "is added to what the earlier ones left."),
                    ()),
        3: StepText(("Store the accumulator into the shared tile Cs (wmma::store_matrix_sync):",
                     "where Cs starts, its leading dimension (a row of Cs holds 16 elements) and",
                     "its layout, which must be the one Cs is read in below (Cs[r][c]: row-major).",
                     "The given code then copies Cs to C."),
                    ()),
    },
    outputs=(Output("C", ("r", "c"), {"r": WMMA_TILE, "c": WMMA_TILE}),),
    cases=with_variants((
        _case("base", "the base case (bfloat16)", 32, 32, 48),
        _case("one_tile", "a single k-tile (K = 16)", 32, 32, 16),
        _case("tail", "M, N and K not multiples of 16", 37, 29, 45),
    ), variants()),
    inputs=inputs, run=run, truth=truth,
    alternatives={"tile_transposed": ("A B with every 16 x 16 tile transposed",
                                      transposed_tiles), **WMMA_SLIPS},
    traffic=lambda case: [traffic.wmma_gemm(case.sizes["M"], case.sizes["N"], case.sizes["K"],
                                            CTYPES[case.options["dtype"]])],
    kernels=tuple(f"wmma_gemm<{c}>" for c in CTYPES.values()),
    picture=("wmma_gemm", ("C",)),
    hints={
        "tile_transposed": (
            "Every tile of C comes out transposed. In which layout does the accumulator go into "
            "Cs, and in which is Cs read?",
            "Step 3: Cs is read row by row (Cs[r][c]); the store must name the row-major layout "
            "and a row length of 16."),
        "multi_tile": (
            "C is right with one k-tile and wrong with several. What happens to the accumulator "
            "from one k-tile to the next?",
            "Step 2: the accumulator must be both the C operand and the result, so that each "
            "k-tile's product is added to what the earlier ones left; a zeroed or fresh fragment "
            "as C keeps only the last k-tile."),
        "everywhere": (
            "C is wrong everywhere. Is each fragment loaded with the leading dimension of its own "
            "tile?",
            "Step 1: a leading dimension is the row length of the tile being loaded: As rows are "
            "KT elements long, Bs rows 16; another value reads the tile with another shape."),
    },
)
