"""The one table of tile sizes and limits the launch wrappers use, and where each comes from.

    LANES, WARP, NAIVE_TILE   kernels/common.cuh (read from it: the kernels and the wrappers
                              cannot disagree)
    SHARED_LIMIT              the static shared memory a block may use without opting in, from
                              the emulator's abi.h (the same limit the emulator enforces)
    FWD_TILES, BWD_TILES      the default (Br, Bc) per head dim: chosen here, passed to the
                              templated flash kernels as template arguments
    SOFTMAX_ROWS              rows (one warp each) per block of the attention row-wise
                              kernels: a launch choice, the kernels read it from blockDim.y
    SGEMM_TILE                TILE of kernels/sgemm_tiled.cu (read from it)
    SOFTMAX_ROWS_PER_BLOCK    ROWS_PER_BLOCK of kernels/softmax_rows.cu (read from it)
    WMMA_TILE                 the C tile of kernels/wmma_gemm.cu (read from it); WMMA_TYPES its
                              input types (tf32 tensor cores for float)
"""

from __future__ import annotations

from ckptlab import cdefs, device
from ckptlab.emu import abi

_COMMON = cdefs.read(device.KERNELS_DIR / "common.cuh")
LANES = _COMMON["LANES"]  # threads per tile row in the flash kernels
WARP = _COMMON["WARP"]
NAIVE_TILE = _COMMON["NAIVE_TILE"]  # output tile of the naive matmuls
SHARED_LIMIT = abi.SHARED_STATIC_LIMIT
SOFTMAX_ROWS = 4
MAX_TILE = abi.MAX_BLOCK_THREADS // LANES  # a block has Br * LANES (or Bc * LANES) threads

SGEMM_TILE = cdefs.constant(device.KERNELS_DIR / "sgemm_tiled.cu", "TILE")
SOFTMAX_ROWS_PER_BLOCK = cdefs.constant(device.KERNELS_DIR / "softmax_rows.cu", "ROWS_PER_BLOCK")
WMMA_TILE = cdefs.constant(device.KERNELS_DIR / "wmma_gemm.cu", "WMMA_TILE")
WMMA_TYPES = {"__half": 2, "__nv_bfloat16": 2, "float": 4}  # C type -> bytes per input element

HEAD_DIMS = (16, 32, 64, 128)
# default (Br, Bc) per head dim: power-of-two tiles whose shared memory stays within 48 KiB
# (with a block of Br * LANES threads, 512 at most, so 128 registers a thread still fit)
FWD_TILES = {16: (64, 32), 32: (64, 32), 64: (64, 32), 128: (32, 16)}
BWD_TILES = {16: (32, 32), 32: (32, 32), 64: (32, 32), 128: (16, 16)}


def flash_fwd_shared_bytes(d: int, Br: int, Bc: int) -> int:
    """Static shared memory of attn_flash_fwd<d, Br, Bc>: Qs, Ks (padded), Vs, Ps (padded)."""
    return 4 * (Br * (d + 1) + Bc * (d + 1) + Bc * d + Br * (Bc + 1))


def flash_bwd_shared_bytes(d: int, Br: int, Bc: int) -> int:
    """Static shared memory of attn_flash_bwd_dkdv<d, Br, Bc> (the larger of the two backward
    kernels): K, V, Q, dO tiles (padded), P and dS tiles (padded), L and D."""
    return 4 * (2 * Bc * (d + 1) + 2 * Br * (d + 1) + 2 * Br * (Bc + 1) + 2 * Br)


def template_name(name: str, *args) -> str:
    return f"{name}<{', '.join(str(a).lower() for a in args)}>"


def instantiations(filename: str) -> list[str]:
    """The template instantiations the wrappers launch by default from a kernel file (every
    head dim with its default tiles; for the backward both dQ modes): what CuPy/the emulator
    compile as name_expressions, and what `python -m ckptlab kernels` reports."""
    if filename == "attn_flash_fwd.cu":
        return [template_name("attn_flash_fwd", d, *FWD_TILES[d]) for d in HEAD_DIMS]
    if filename == "attn_flash_bwd.cu":
        dkdv = [template_name("attn_flash_bwd_dkdv", d, *BWD_TILES[d], deterministic)
                for d in HEAD_DIMS for deterministic in (False, True)]
        return dkdv + [template_name("attn_flash_bwd_dq", d, *BWD_TILES[d]) for d in HEAD_DIMS]
    if filename == "wmma_gemm.cu":
        return [template_name("wmma_gemm", t) for t in WMMA_TYPES]
    return []
