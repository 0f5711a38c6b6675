"""Analytic HBM bytes and FLOPs of every attention kernel launch, per pointer argument.

These are the "modeled" numbers (docs/design.md, "Measurement"): each formula follows the loads and
stores the kernel source issues, so the emulator's counted bytes must equal them exactly
(tests/test_attention_traffic.py). Like the emulator they model no cache: an operand tile that a
second block loads again counts again, as it would if L2 did not catch it.

Bytes: fp32 everywhere (4 bytes an element); per (b, h), times B*H.
    naive matmul tile T = NAIVE_TILE: C = A B with A (M x K), B (K x N) reads A ceil(N/T)
    times and B ceil(M/T) times, and writes C once.
    flash: K/V (forward, dq) or Q/dO/L/D (dkdv) are read once per visited tile pair
    (tile_pairs), which is all Tr * Tc pairs unless causal.
FLOPs: matmul FLOPs only (2 per multiply-add; exp, max and sums are O(Nq Nk), not O(Nq Nk d)):
    model FLOPs  the useful work of attention on the visible (i, j) pairs: 4 d per pair forward
                 (S = Q K^T, O = P V), 8 d backward (dV, dP, dQ, dK). The same for every method.
    hardware     what a kernel executes, masked entries of the tiles it computes included:
                 the naive kernels compute all Nq*Nk pairs; the flash backward adds 2 d per pair
                 to recompute S (FlashAttention's "2.5x forward" backward), and the
                 deterministic dQ kernel 4 d more to recompute S and dO V^T again.
    recompute    the part of hardware FLOPs that redoes work already done once: S = Q K^T in the
                 flash backward, and S and dP = dO V^T again in the deterministic dQ kernel
                 (listed separately).
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptlab.kernels.common import ceil_div
from ckptlab.kernels.table import (  # noqa: F401  (SOFTMAX_ROWS_PER_BLOCK: for the labs)
    BWD_TILES,
    FWD_TILES,
    NAIVE_TILE,
    SGEMM_TILE,
    SOFTMAX_ROWS_PER_BLOCK,
    WMMA_TILE,
    WMMA_TYPES,
    template_name,
)

BYTES = 4  # fp32


@dataclass(frozen=True)
class KernelTraffic:
    """One launch: bytes read and written and atomicAdds per pointer argument (every pointer
    parameter of the kernel appears, zeros included), FLOPs executed, the recompute part."""

    kernel: str  # the launched name, e.g. "attn_flash_fwd<64, 64, 32>"
    read: dict  # parameter name -> bytes read
    write: dict  # parameter name -> bytes written
    atomics: dict  # parameter name -> atomicAdd operations (4 bytes each, not in read/write)
    flops: int  # hardware FLOPs
    recompute_flops: int = 0

    @property
    def bytes_read(self) -> int:
        return sum(self.read.values())

    @property
    def bytes_written(self) -> int:
        return sum(self.write.values())

    @property
    def atomic_bytes(self) -> int:
        return BYTES * sum(self.atomics.values())

    @property
    def bytes(self) -> int:
        """All global traffic: reads + writes + atomic read-modify-writes (4 bytes each)."""
        return self.bytes_read + self.bytes_written + self.atomic_bytes


def _kernel(name, read, write=None, atomics=None, flops=0, recompute=0) -> KernelTraffic:
    """A KernelTraffic whose dicts all have the same keys (every pointer argument)."""
    write, atomics = write or {}, atomics or {}
    names = list(dict.fromkeys([*read, *write, *atomics]))
    return KernelTraffic(name, {n: int(read.get(n, 0)) for n in names},
                         {n: int(write.get(n, 0)) for n in names},
                         {n: int(atomics.get(n, 0)) for n in names}, int(flops), int(recompute))


def visible_pairs(Nq: int, Nk: int, causal: bool) -> int:
    """Number of (i, j) with query i seeing key j: Nq*Nk, or with j <= i + Nk - Nq."""
    if not causal:
        return Nq * Nk
    return sum(max(0, min(Nk, i + Nk - Nq + 1)) for i in range(Nq))


def tile_pairs(Nq: int, Nk: int, Br: int, Bc: int, causal: bool) -> list:
    """(rows, cols) of every (Q tile, K/V tile) pair a flash kernel visits: all of them, or
    (causal) those whose key tile starts at or before the last key the Q tile's last row sees.
    rows = min(Br, Nq - q0) and cols = min(Bc, Nk - k0) handle the tails."""
    pairs = []
    for q0 in range(0, Nq, Br):
        last_key = min(q0 + Br, Nq) - 1 + Nk - Nq
        for k0 in range(0, Nk, Bc):
            if causal and k0 > last_key:
                break
            pairs.append((min(Br, Nq - q0), min(Bc, Nk - k0)))
    return pairs


def model_flops(B, H, Nq, Nk, d, causal=False, backward=False) -> int:
    """Useful matmul FLOPs: 4 d (forward) or 8 d (backward) per visible (i, j) pair."""
    return B * H * visible_pairs(Nq, Nk, causal) * d * (8 if backward else 4)


def _matmul(name, M, N, K, a, b, c, BH, flops=True) -> KernelTraffic:
    """A naive tiled matmul launch: C (M x N) = A (M x K) B (K x N), argument names a, b, c."""
    T = NAIVE_TILE
    read = {a: M * K * ceil_div(N, T), b: K * N * ceil_div(M, T)}
    return _kernel(name, {n: BYTES * BH * x for n, x in read.items()}, {c: BYTES * BH * M * N},
                   flops=2 * BH * M * N * K if flops else 0)


def naive_forward_traffic(B, H, Nq, Nk, d, causal=False) -> list:
    """attn_naive_scores, attn_naive_softmax, attn_naive_pv (causal changes nothing: the naive
    kernels compute every pair and mask afterwards)."""
    BH, nn = B * H, B * H * Nq * Nk * BYTES
    return [
        _matmul("attn_naive_scores", Nq, Nk, d, "Q", "K", "S", BH),
        _kernel("attn_naive_softmax", {"S": 2 * nn}, {"P": nn}),  # two passes over S
        _matmul("attn_naive_pv", Nq, d, Nk, "P", "V", "O", BH),
    ]


def naive_backward_traffic(B, H, Nq, Nk, d, causal=False) -> list:
    """attn_naive_bwd_dv, _dp, _ds, _dq, _dk: four matmuls and the softmax backward."""
    BH, nn = B * H, B * H * Nq * Nk * BYTES
    return [
        _matmul("attn_naive_bwd_dv", Nk, d, Nq, "P", "dO", "dV", BH),
        _matmul("attn_naive_bwd_dp", Nq, Nk, d, "dO", "V", "dP", BH),
        _kernel("attn_naive_bwd_ds", {"P": 2 * nn, "dP": 2 * nn}, {"dS": nn}),  # two passes
        _matmul("attn_naive_bwd_dq", Nq, d, Nk, "dS", "K", "dQ", BH),
        _matmul("attn_naive_bwd_dk", Nk, d, Nq, "dS", "Q", "dK", BH),
    ]


def flash_forward_traffic(B, H, Nq, Nk, d, causal=False, Br=None, Bc=None) -> list:
    """attn_flash_fwd<d, Br, Bc>: Q once, K and V once per visited tile pair, O and L once."""
    Br, Bc = (Br, Bc) if Br and Bc else FWD_TILES[d]
    pairs = tile_pairs(Nq, Nk, Br, Bc, causal)
    kv = sum(cols for _, cols in pairs) * d
    computed = sum(rows * cols for rows, cols in pairs)
    w = BYTES * B * H
    return [_kernel(template_name("attn_flash_fwd", d, Br, Bc),
                    {"Q": w * Nq * d, "K": w * kv, "V": w * kv},
                    {"O": w * Nq * d, "L": w * Nq}, flops=B * H * computed * 4 * d)]


def flash_backward_traffic(B, H, Nq, Nk, d, causal=False, deterministic=False, Br=None,
                           Bc=None) -> list:
    """attn_flash_bwd_preprocess, attn_flash_bwd_dkdv<d, Br, Bc, deterministic> and, when
    deterministic, attn_flash_bwd_dq<d, Br, Bc>."""
    Br, Bc = (Br, Bc) if Br and Bc else BWD_TILES[d]
    atomic = not deterministic  # dQ accumulated by atomicAdd in the dK/dV kernel
    pairs = tile_pairs(Nq, Nk, Br, Bc, causal)
    q_rows = sum(rows for rows, _ in pairs)  # Q rows read by dkdv, over all tile pairs
    kv_cols = sum(cols for _, cols in pairs)  # K/V rows read by dq, over all tile pairs
    computed = sum(rows * cols for rows, cols in pairs)
    w, BH = BYTES * B * H, B * H
    out = [_kernel("attn_flash_bwd_preprocess", {"O": w * Nq * d, "dO": w * Nq * d, "D": 0},
                   {"D": w * Nq, "dQ": w * Nq * d if atomic else 0})]
    per_pair = 10 if atomic else 8  # S, dP, dV, dK (+ dQ): 2 d FLOPs per pair each
    out.append(_kernel(
        template_name("attn_flash_bwd_dkdv", d, Br, Bc, deterministic),
        {"Q": w * q_rows * d, "K": w * Nk * d, "V": w * Nk * d, "dO": w * q_rows * d,
         "L": w * q_rows, "D": w * q_rows},
        {"dQ": 0, "dK": w * Nk * d, "dV": w * Nk * d},
        {"dQ": BH * q_rows * d if atomic else 0},
        flops=BH * computed * per_pair * d, recompute=BH * computed * 2 * d))
    if deterministic:  # S, dP, dQ: S and dP are recomputed a second time
        out.append(_kernel(
            template_name("attn_flash_bwd_dq", d, Br, Bc),
            {"Q": w * Nq * d, "K": w * kv_cols * d, "V": w * kv_cols * d, "dO": w * Nq * d,
             "L": w * Nq, "D": w * Nq},
            {"dQ": w * Nq * d}, flops=BH * computed * 6 * d, recompute=BH * computed * 4 * d))
    return out


METHODS = ("naive", "flash", "flash-det")  # flash-det: the deterministic dQ backward


def launches(method: str, B, H, Nq, Nk, d, causal=False) -> list:
    """The modeled KernelTraffic of every launch of one forward + backward of `method`."""
    if method == "naive":
        return naive_forward_traffic(B, H, Nq, Nk, d, causal) + naive_backward_traffic(
            B, H, Nq, Nk, d, causal)
    if method in ("flash", "flash-det"):
        return flash_forward_traffic(B, H, Nq, Nk, d, causal) + flash_backward_traffic(
            B, H, Nq, Nk, d, causal, deterministic=method == "flash-det")
    raise ValueError(f"method: expected one of {METHODS}, got {method!r}")


def totals(runs: list) -> dict:
    """Sums over a list of KernelTraffic: bytes read, written, atomic, all; FLOPs; recompute."""
    return {
        "bytes_read": sum(x.bytes_read for x in runs),
        "bytes_written": sum(x.bytes_written for x in runs),
        "atomic_bytes": sum(x.atomic_bytes for x in runs),
        "bytes": sum(x.bytes for x in runs),
        "flops": sum(x.flops for x in runs),
        "recompute_flops": sum(x.recompute_flops for x in runs),
    }


# ---- the emulator's example kernels (labs/01: one compute-heavy, one memory-bound) ----------


def sgemm_tiled(M: int, N: int, K: int, tile: int = SGEMM_TILE) -> KernelTraffic:
    """kernels/sgemm_tiled.cu, C = A B: A read ceil(N/tile) times, B ceil(M/tile) times, C
    written once; 2 M N K FLOPs."""
    return _kernel("sgemm_tiled",
                   {"A": BYTES * M * K * ceil_div(N, tile), "B": BYTES * K * N * ceil_div(M, tile)},
                   {"C": BYTES * M * N}, flops=2 * M * N * K)


def wmma_gemm(M: int, N: int, K: int, ctype: str = "__nv_bfloat16",
              tile: int = WMMA_TILE) -> KernelTraffic:
    """kernels/wmma_gemm.cu<ctype>, C = A B on tensor cores: sgemm_tiled's tiling with inputs
    of WMMA_TYPES[ctype] bytes (2 for __half and __nv_bfloat16, 4 for float as tf32): A read
    ceil(N/tile) times, B ceil(M/tile) times, C (fp32) written once; 2 M N K FLOPs."""
    if ctype not in WMMA_TYPES:
        raise ValueError(f"ctype: expected one of {sorted(WMMA_TYPES)}, got {ctype!r}")
    e = WMMA_TYPES[ctype]
    return _kernel(template_name("wmma_gemm", ctype),
                   {"A": e * M * K * ceil_div(N, tile), "B": e * K * N * ceil_div(M, tile)},
                   {"C": BYTES * M * N}, flops=2 * M * N * K)


def softmax_rows(R: int, C: int) -> KernelTraffic:
    """kernels/softmax_rows.cu: x read twice (online max/sum pass, then the output pass), y
    written once. FLOPs: 0 matmul FLOPs; about 5 R C pointwise operations (max, 2 exp, fma,
    scale), counted here so the roofline can place the kernel."""
    return _kernel("softmax_rows", {"x": 2 * BYTES * R * C}, {"y": BYTES * R * C},
                   flops=5 * R * C)
