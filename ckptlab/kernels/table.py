"""The one table of tile sizes and limits the launch wrappers use, and where each comes from.

    LANES, WARP, NAIVE_TILE   kernels/common.cuh (read from it: the kernels and the wrappers
    MAX_HEAD_DIM              cannot disagree)
    SHARED_LIMIT              the static shared memory a block may use without opting in, from
                              the emulator's abi.h (the same limit the emulator enforces)
    HEAD_DIMS                 every head dim d the flash and stored kernels take: the
                              multiples of LANES up to MAX_HEAD_DIM (FlashAttention's range)
    TILE_HEAD_DIMS            the tile head dims Dt the kernels are instantiated for; d is
                              rounded up to the next one (tile_head_dim), the padded columns
                              are zero in shared memory and never touch global memory
    FWD_TILES, BWD_TILES      the default (Br, Bc) per tile head dim: chosen here, passed to the
                              templated flash kernels as template arguments
    SOFTMAX_ROWS              rows (one warp each) per block of the attention row-wise
                              kernels: a launch choice, the kernels read it from blockDim.y
    SGEMM_TILE                TILE of kernels/sgemm_tiled.cu (read from it)
    SOFTMAX_ROWS_PER_BLOCK    ROWS_PER_BLOCK of kernels/softmax_rows.cu (read from it)
"""

from __future__ import annotations

from ckptlab import cdefs, device
from ckptlab.emu import abi

_COMMON = cdefs.read(device.KERNELS_DIR / "common.cuh")
LANES = _COMMON["LANES"]  # threads per tile row in the flash kernels
WARP = _COMMON["WARP"]
NAIVE_TILE = _COMMON["NAIVE_TILE"]  # output tile of the naive matmuls
MAX_HEAD_DIM = _COMMON["MAX_HEAD_DIM"]
SHARED_LIMIT = abi.SHARED_STATIC_LIMIT
SOFTMAX_ROWS = 4
MAX_TILE = abi.MAX_BLOCK_THREADS // LANES  # a block has Br * LANES (or Bc * LANES) threads

SGEMM_TILE = cdefs.constant(device.KERNELS_DIR / "sgemm_tiled.cu", "TILE")
SOFTMAX_ROWS_PER_BLOCK = cdefs.constant(device.KERNELS_DIR / "softmax_rows.cu", "ROWS_PER_BLOCK")

HEAD_DIMS = tuple(range(LANES, MAX_HEAD_DIM + 1, LANES))
# FlashAttention 2 rounds d up to 32, 64, 96, 128, 160, 192, 224 or 256; 16 is kept here for
# the small head dims of the labs, 224 is left out (d in 200..224 pads to 256: one compile
# fewer per kernel for a rare size).
TILE_HEAD_DIMS = (16, 32, 64, 96, 128, 160, 192, 256)
# Default (Br, Bc) per tile head dim: the largest tiles whose static shared memory stays within
# 48 KiB (flash_fwd_shared_bytes / flash_bwd_shared_bytes), preferring a long Br in the forward
# (K and V are re-read once per query tile) and a long Bc in the backward (Q and dO are
# re-read once per key tile by attn_flash_bwd_dkdv, which also does the atomic dQ). A block has
# at most 512 threads, so 128 registers a thread still fit.
FWD_TILES = {16: (64, 32), 32: (64, 32), 64: (64, 32), 96: (64, 16), 128: (32, 16),
             160: (32, 16), 192: (32, 8), 256: (16, 8)}
BWD_TILES = {16: (32, 32), 32: (32, 32), 64: (32, 32), 96: (16, 32), 128: (16, 16),
             160: (16, 16), 192: (8, 16), 256: (8, 8)}


def tile_head_dim(d: int) -> int:
    """Dt, the tile head dim the kernels run head dim d with: the smallest TILE_HEAD_DIMS
    entry >= d (d itself for 16, 32, 64, 96, 128, 160, 192, 256)."""
    if d not in HEAD_DIMS:
        raise ValueError(f"head dim d must be a multiple of {LANES} in [{LANES}, "
                         f"{MAX_HEAD_DIM}], got d={d}")
    return next(t for t in TILE_HEAD_DIMS if t >= d)


def fwd_tiles(d: int) -> tuple:
    """Default (Br, Bc) of the forward at head dim d."""
    return FWD_TILES[tile_head_dim(d)]


def bwd_tiles(d: int) -> tuple:
    """Default (Br, Bc) of the backward at head dim d."""
    return BWD_TILES[tile_head_dim(d)]


def flash_fwd_shared_bytes(d: int, Br: int, Bc: int) -> int:
    """Static shared memory of attn_flash_fwd<Dt, Br, Bc, *> at head dim d (tiles Dt wide):
    Qs, Ks (padded), Vs, Ps (padded)."""
    D = tile_head_dim(d)
    return 4 * (Br * (D + 1) + Bc * (D + 1) + Bc * D + Br * (Bc + 1))


def flash_bwd_shared_bytes(d: int, Br: int, Bc: int) -> int:
    """Static shared memory of attn_flash_bwd_dkdv<Dt, Br, Bc, *, *> at head dim d (the larger
    of the two backward kernels): K, V, Q, dO tiles (padded), P and dS tiles (padded), L, D."""
    D = tile_head_dim(d)
    return 4 * (2 * Bc * (D + 1) + 2 * Br * (D + 1) + 2 * Br * (Bc + 1) + 2 * Br)


def dkdv_shared_bytes(d: int, Br: int, Bc: int, deterministic: bool = False,
                      stored: bool = False) -> int:
    """Static shared memory of attn_flash_bwd_dkdv<Dt, Br, Bc, deterministic, stored> as ptxas
    allocates it: flash_bwd_shared_bytes, less the K tile in the stored deterministic kernel
    (K serves only S = Q K^T and the atomic dQ there; the array is never used)."""
    unused_k = Bc * (tile_head_dim(d) + 1) if stored and deterministic else 0
    return flash_bwd_shared_bytes(d, Br, Bc) - 4 * unused_k


def dq_shared_bytes(d: int, Br: int, Bc: int, stored: bool = False) -> int:
    """Static shared memory of attn_flash_bwd_dq<Dt, Br, Bc, stored>: Q (flash only: it serves
    S = Q K^T), dO, K, V tiles (padded), the dS tile (padded), L and D."""
    D = tile_head_dim(d)
    q = 0 if stored else Br * (D + 1)
    return 4 * (q + Br * (D + 1) + 2 * Bc * (D + 1) + Br * (Bc + 1) + 2 * Br)


def template_name(name: str, *args) -> str:
    return f"{name}<{', '.join(str(a).lower() for a in args)}>"


def fwd_name(d: int, Br: int, Bc: int, stored: bool) -> str:
    return template_name("attn_flash_fwd", tile_head_dim(d), Br, Bc, stored)


def dkdv_name(d: int, Br: int, Bc: int, deterministic: bool, stored: bool) -> str:
    return template_name("attn_flash_bwd_dkdv", tile_head_dim(d), Br, Bc, deterministic, stored)


def dq_name(d: int, Br: int, Bc: int, stored: bool) -> str:
    return template_name("attn_flash_bwd_dq", tile_head_dim(d), Br, Bc, stored)


def instantiations(filename: str, tile_dims=TILE_HEAD_DIMS) -> list[str]:
    """The template instantiations the wrappers launch by default from a kernel file, for
    every tile head dim (so every head dim d), flash and stored, and in the backward both dQ
    modes: what `python -m ckptlab kernels` compiles and reports. `tile_dims` narrows the list
    (the wrappers load one tile head dim at a time)."""
    names = []
    for D in tile_dims:
        for stored in (False, True):
            if filename == "attn_flash_fwd.cu":
                names.append(fwd_name(D, *FWD_TILES[D], stored))
            elif filename == "attn_flash_bwd.cu":
                names += [dkdv_name(D, *BWD_TILES[D], det, stored) for det in (False, True)]
                names.append(dq_name(D, *BWD_TILES[D], stored))
    return names
