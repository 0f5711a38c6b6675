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
    WMMA_TILE                 the C tile of kernels/wmma_gemm.cu (read from it); WMMA_TYPES its
                              input types (tf32 tensor cores for float)
"""

from __future__ import annotations

import numpy as np

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
WMMA_TILE = cdefs.constant(device.KERNELS_DIR / "wmma_gemm.cu", "WMMA_TILE")
WMMA_TYPES = {"__half": 2, "__nv_bfloat16": 2, "float": 4}  # C type -> bytes per input element

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


def instantiations(filename: str, tile_dims=TILE_HEAD_DIMS, tiles=None) -> list[str]:
    """The template instantiations the wrappers launch by default from a kernel file, for
    every tile head dim (so every head dim d), flash and stored, and in the backward both dQ
    modes: what `python -m ckptlab kernels` compiles and reports. `tile_dims` narrows the list
    (the wrappers load one tile head dim at a time); `tiles` = (Br, Bc) names the flash
    kernels' instantiations at those tiles instead of the defaults (a launch with `tiles=`)."""
    if filename == "wmma_gemm.cu":
        return [template_name("wmma_gemm", t) for t in WMMA_TYPES]
    if filename in ("attn_flash_fwd_tc.cu", "attn_flash_bwd_tc.cu"):
        fwd = filename == "attn_flash_fwd_tc.cu"
        return [n for t in TC_TYPES.values() for Dt in tile_dims
                for role, n in tc_names(t, Dt).items() if role.startswith("fwd") == fwd
                and (role not in ("preprocess", "convert") or Dt == tile_dims[0])]
    names = []
    for D in tile_dims:
        for stored in (False, True):
            if filename == "attn_flash_fwd.cu":
                names.append(fwd_name(D, *(tiles or FWD_TILES[D]), stored))
            elif filename == "attn_flash_bwd.cu":
                t = tiles or BWD_TILES[D]
                names += [dkdv_name(D, *t, det, stored) for det in (False, True)]
                names.append(dq_name(D, *t, stored))
    return names


# ---- tensor-core attention (kernels/attn_flash_*_tc.cu): 16-bit storage, wmma, fp32 math ----
TC = cdefs.constant(device.KERNELS_DIR / "tc_common.cuh", "TC")  # the wmma tile: 16 x 16 x 16
TC_TYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16"}  # NumPy dtype name -> C type T
# d is rounded up to a tile head dim Dt, a multiple of TC (FlashAttention 2's 32, 64, 96, 128,
# 160, 192, 256, and 16 for the labs' small heads); padded columns are zero in shared memory
TC_TILE_HEAD_DIMS = TILE_HEAD_DIMS
# Default (Br, Bc) per Dt: the fp32 kernels' own tiles (FWD_TILES, BWD_TILES) wherever they
# are multiples of the wmma tile, so that comparing the two changes the precision and nothing
# else (the same blocks, the same re-reads of K, V or Q, dO); 16 x 16 where the fp32 tiles are
# narrower. The tensor-core tiles need more shared memory (an fp32 O or dK/dV accumulator
# beside 16-bit tiles, padded rows): above 48 KiB the launch opts in, as CUDA requires.
TC_FWD_TILES = {Dt: t if t[0] % TC == 0 and t[1] % TC == 0 else (TC, TC)
                for Dt, t in FWD_TILES.items()}
TC_BWD_TILES = {Dt: t if t[0] % TC == 0 and t[1] % TC == 0 else (TC, TC)
                for Dt, t in BWD_TILES.items()}
# The most shared memory a block may opt in to on every GPU with bf16 tensor cores: 99 KiB on
# compute capability 8.6 / 8.9 (163 KiB on 8.0, 227 KiB on 9.0; CUDA C++ Programming Guide,
# "Technical Specifications per Compute Capability").
TC_SHARED_MAX = 99 * 1024
# Threads per block of attn_flash_bwd_dq_convert_tc (one dQ element a thread): a launch
# choice, the kernel reads blockDim.x.
TC_CONVERT_THREADS = 256


def tc_tile_head_dim(d: int) -> int:
    """Dt for head dim d, as the fp32 kernels round it (tile_head_dim): every TILE_HEAD_DIMS
    entry is a multiple of TC."""
    if not isinstance(d, (int, np.integer)):
        raise ValueError(f"head dim d must be an int, got d={d!r}")
    return tile_head_dim(int(d))


def tc_block_threads(rows: int) -> int:
    """Threads of a tensor-core attention block over `rows` tile rows (Br for the forward and
    dQ kernels, Bc for dK/dV): one warp per TC-row strip of wmma tiles."""
    return rows // TC * WARP


def _tc_round(n: int) -> int:  # each region of the dynamic shared buffer starts 128-aligned
    return -(-n // 128) * 128


def _pitches(Dt: int, Bc: int) -> tuple:
    """Row pitches of tc_common.cuh's Pitch: LDT (T), LDS (fp32), LDP (T), LDO (fp32)."""
    return Dt + 8, Bc + 4, Bc + 8, Dt + 4


def tc_fwd_shared_bytes(Dt: int, Br: int, Bc: int, e: int = 2) -> int:
    """FwdSmem<T, Dt, Br, Bc>::bytes (e = sizeof(T)): Q_i, K_j, V_j; S; P_dropped; O."""
    LDT, LDS, LDP, LDO = _pitches(Dt, Bc)
    return sum(map(_tc_round, (Br * LDT * e, Bc * LDT * e, Bc * LDT * e, Br * LDS * 4,
                               Br * LDP * e, Br * LDO * 4)))


def tc_bwd_shared_bytes(Dt: int, Br: int, Bc: int, e: int = 2) -> int:
    """BwdSmem<T, Dt, Br, Bc>::bytes: K_j, V_j, Q_i, dO_i; S and dP (or the atomic dQ tile);
    P_dropped, dS; the dK, dV accumulators; L_i, D_i."""
    LDT, LDS, LDP, LDO = _pitches(Dt, Bc)
    return sum(map(_tc_round, (Bc * LDT * e, Bc * LDT * e, Br * LDT * e, Br * LDT * e,
                               max(2 * Br * LDS * 4, Br * LDO * 4), Br * LDP * e, Br * LDP * e,
                               Bc * LDO * 4, Bc * LDO * 4, Br * 4, Br * 4)))


def tc_dq_shared_bytes(Dt: int, Br: int, Bc: int, e: int = 2) -> int:
    """DqSmem<T, Dt, Br, Bc>::bytes: Q_i, dO_i, K_j, V_j; S, dP; dS; the dQ accumulator; L, D."""
    LDT, LDS, LDP, LDO = _pitches(Dt, Bc)
    return sum(map(_tc_round, (Br * LDT * e, Br * LDT * e, Bc * LDT * e, Bc * LDT * e,
                               Br * LDS * 4, Br * LDS * 4, Br * LDP * e, Br * LDO * 4, Br * 4,
                               Br * 4)))


def tc_names(ctype: str, Dt: int, fwd=None, bwd=None) -> dict:
    """The template instantiations of the tensor-core kernels for C type `ctype` at tile head
    dim Dt with tiles fwd = (Br, Bc), bwd = (Br, Bc) (default: the table's), by role."""
    Br, Bc = fwd or TC_FWD_TILES[Dt]
    bBr, bBc = bwd or TC_BWD_TILES[Dt]
    names = {f"fwd_{m}": template_name("attn_flash_fwd_tc", ctype, Dt, Br, Bc, m == "stored")
             for m in ("flash", "stored")}
    for m in ("flash", "stored"):
        for det in (False, True):
            names[f"dkdv_{m}_{det}"] = template_name("attn_flash_bwd_dkdv_tc", ctype, Dt, bBr,
                                                     bBc, det, m == "stored")
        names[f"dq_{m}"] = template_name("attn_flash_bwd_dq_tc", ctype, Dt, bBr, bBc,
                                         m == "stored")
    names["preprocess"] = template_name("attn_flash_bwd_preprocess_tc", ctype)
    names["convert"] = template_name("attn_flash_bwd_dq_convert_tc", ctype)
    return names


def dynamic_shared_bytes(kernel: str) -> int | None:
    """The dynamic shared memory a wrapper launches `kernel` with (a name as ptxas reports it,
    e.g. 'attn_flash_fwd_tc<__nv_bfloat16, 64, 64, 32, false>'), or None for kernels whose
    shared memory is all static (ptxas' smem column)."""
    sizes = {"attn_flash_fwd_tc": tc_fwd_shared_bytes,
             "attn_flash_bwd_dkdv_tc": tc_bwd_shared_bytes,
             "attn_flash_bwd_dq_tc": tc_dq_shared_bytes}
    base, _, args = kernel.partition("<")
    if base.strip() not in sizes:
        return None
    _, Dt, Br, Bc = (a.strip() for a in args.rstrip(">").split(",")[:4])
    return sizes[base.strip()](int(Dt), int(Br), int(Bc))
