"""Analytic HBM bytes and FLOPs of every attention kernel launch, per pointer argument.

The "modeled" numbers (docs/design.md, "Measurement"): each formula follows the kernel's loads
and stores, so the emulator's counts equal them exactly (tests/test_*traffic*.py). Per argument:
    counted  every global-memory request, no cache: an operand tile that a second block loads
             again counts again (read, write; atomics apart). An upper bound on DRAM traffic.
    unique   the distinct bytes a launch touches: unique_read, unique_write (plain loads and
             stores) and unique_atomic (the bytes atomicAdd updates). What an infinite cache
             would move: each byte read once, each byte written back once, an atomically
             updated byte both (as the emulator counts it: its unique_read_bytes is unique_read
             + unique_atomic, likewise for writes). A lower bound on DRAM traffic.
Real DRAM traffic (Nsight Compute's dram__bytes) lies between the two. One caveat: a counted
atomicAdd is 4 bytes an operation, a unique one 8 (read and written back), so where each address
gets a single add (one key tile) dQ's unique bytes exceed its counted ones; per direction
(unique read <= counted read + atomic bytes, likewise written) the bracket holds.

Bytes: fp32 everywhere (4 bytes an element); per (b, h), times B*H.
    naive matmul, tile T = NAIVE_TILE: C = A B reads A ceil(N/T), B ceil(M/T) times, C once.
    fused (stored and flash): K/V (forward, dq) or Q/dO/L/D (dkdv) are read once per visited
    tile pair (tile_pairs, counted in ckptlab.measure.pair_counts), which is all Tr * Tc pairs
    unless causal; stored also writes S once (one float per visible (i, j)) and each backward
    kernel reads it once; its dq kernel reads no Q, its deterministic dK/dV kernel no K (they
    served only S = Q K^T, K also the atomic dQ).

FLOPs, one convention for every attention kernel here and for the engine's attention op
(ckptlab.engine.layers.attention): matmul FLOPs only, 2 per multiply-add; exp, max, sums and
dropout are not counted (O(Nq Nk) against O(Nq Nk d)).
    model FLOPs  the useful work of attention on the visible (i, j) pairs: 4 d per pair forward
                 (S = Q K^T, O = P V), 8 d backward (dV, dP, dQ, dK). The same for every method.
    hardware     what the kernels execute, as run: whole tiles, padding included (rows past N,
                 the head dim padded to the tile head dim Dt, the k-loop padding of the naive
                 matmuls), masked entries included, causally skipped tiles excluded. The flash
                 backward adds S = Q K^T per pair (FlashAttention's "2.5x forward" backward), the
                 deterministic dQ kernel S and dO V^T again; stored adds only dO V^T again in the
                 deterministic dQ kernel. On tiles that divide N and d = Dt there is no padding.
    recompute    the part of hardware FLOPs that redoes work already done once: S = Q K^T in the
                 flash backward; dP = dO V^T (and, flash, S) again in the deterministic dQ kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ckptlab.kernels.common import ceil_div
from ckptlab.kernels.table import (  # noqa: F401  (SOFTMAX_ROWS_PER_BLOCK: for the labs)
    NAIVE_TILE,
    SGEMM_TILE,
    SOFTMAX_ROWS_PER_BLOCK,
    WMMA_TILE,
    WMMA_TYPES,
    bwd_tiles,
    dkdv_name,
    dq_name,
    fwd_name,
    fwd_tiles,
    template_name,
    tile_head_dim,
)
from ckptlab.measure.pair_counts import first_seen_row, tile_pairs, visible_pairs

BYTES = 4  # fp32


@dataclass(frozen=True)
class KernelTraffic:
    """One launch: bytes read and written and atomicAdds per pointer argument (every pointer
    parameter of the kernel appears, zeros included), the unique bytes of each, FLOPs executed
    (hardware, as run), the recompute part."""

    kernel: str  # the launched name, e.g. "attn_flash_fwd<64, 64, 32, false>"
    read: dict  # parameter name -> bytes read (counted)
    write: dict  # parameter name -> bytes written (counted)
    atomics: dict  # parameter name -> atomicAdd operations (4 bytes each, not in read/write)
    flops: int  # hardware FLOPs
    recompute_flops: int = 0
    unique_read: dict = field(default_factory=dict)  # parameter name -> distinct bytes read
    unique_write: dict = field(default_factory=dict)  # ... distinct bytes written
    unique_atomic: dict = field(default_factory=dict)  # ... distinct bytes atomically updated

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

    @property
    def unique_atomic_bytes(self) -> int:
        """What an infinite cache moves for the atomically updated bytes: each read once and
        written back once (2 x unique_atomic; counted atomics are 4 bytes an operation)."""
        return 2 * sum(self.unique_atomic.values())

    @property
    def unique_bytes(self) -> int:
        """Distinct bytes read plus distinct bytes written, an atomically updated byte in both:
        the emulator's global_unique_bytes."""
        return (sum(self.unique_read.values()) + sum(self.unique_write.values())
                + self.unique_atomic_bytes)


def _kernel(name, read, write=None, atomics=None, flops=0, recompute=0, unique=None,
            ) -> KernelTraffic:
    """A KernelTraffic whose dicts all have the same keys (every pointer argument). `unique`:
    (unique_read, unique_write, unique_atomic) dicts; by default each equals the counted bytes
    (a kernel that touches every byte it moves once), atomics 4 bytes per operation."""
    write, atomics = write or {}, atomics or {}
    names = list(dict.fromkeys([*read, *write, *atomics]))
    ur, uw, ua = unique or (read, write, {n: BYTES * x for n, x in atomics.items()})

    def full(dct):
        return {n: int(dct.get(n, 0)) for n in names}

    return KernelTraffic(name, full(read), full(write), full(atomics), int(flops), int(recompute),
                         full(ur), full(uw), full(ua))


def model_flops(B, H, Nq, Nk, d, causal=False, backward=False) -> int:
    """Useful matmul FLOPs: 4 d (forward) or 8 d (backward) per visible (i, j) pair."""
    return B * H * visible_pairs(Nq, Nk, causal) * d * (8 if backward else 4)


# ---- naive: 16 x 16 matmul tiles, S, P, dP, dS through HBM ----------------------------------


def _matmul(name, M, N, K, a, b, c, BH) -> KernelTraffic:
    """A naive tiled matmul launch: C (M x N) = A (M x K) B (K x N), argument names a, b, c.
    Every thread of every block runs the whole padded k-loop: 2 Mp Np Kp FLOPs, Xp = X rounded
    up to the tile. Each in-range element of A, B is loaded (unique: once), C written once."""
    T = NAIVE_TILE
    read = {a: M * K * ceil_div(N, T), b: K * N * ceil_div(M, T)}
    padded = ceil_div(M, T) * ceil_div(N, T) * ceil_div(K, T) * T**3
    unique = ({a: BYTES * BH * M * K, b: BYTES * BH * K * N}, {c: BYTES * BH * M * N}, {})
    return _kernel(name, {n: BYTES * BH * x for n, x in read.items()}, {c: BYTES * BH * M * N},
                   flops=2 * BH * padded, unique=unique)


def naive_forward_traffic(B, H, Nq, Nk, d, causal=False) -> list:
    """attn_naive_scores, attn_naive_softmax, attn_naive_pv (causal changes nothing: the naive
    kernels compute every pair and mask afterwards)."""
    BH, nn = B * H, B * H * Nq * Nk * BYTES
    return [
        _matmul("attn_naive_scores", Nq, Nk, d, "Q", "K", "S", BH),
        _kernel("attn_naive_softmax", {"S": 2 * nn}, {"P": nn},  # two passes over S
                unique=({"S": nn}, {"P": nn}, {})),
        _matmul("attn_naive_pv", Nq, d, Nk, "P", "V", "O", BH),
    ]


def naive_backward_traffic(B, H, Nq, Nk, d, causal=False) -> list:
    """attn_naive_bwd_dv, _dp, _ds, _dq, _dk: four matmuls and the softmax backward."""
    BH, nn = B * H, B * H * Nq * Nk * BYTES
    return [
        _matmul("attn_naive_bwd_dv", Nk, d, Nq, "P", "dO", "dV", BH),
        _matmul("attn_naive_bwd_dp", Nq, Nk, d, "dO", "V", "dP", BH),
        _kernel("attn_naive_bwd_ds", {"P": 2 * nn, "dP": 2 * nn}, {"dS": nn},  # two passes
                unique=({"P": nn, "dP": nn}, {"dS": nn}, {})),
        _matmul("attn_naive_bwd_dq", Nq, d, Nk, "dS", "K", "dQ", BH),
        _matmul("attn_naive_bwd_dk", Nk, d, Nq, "dS", "Q", "dK", BH),
    ]


# ---- fused: the flash tiles; stored writes S once and reads it back, flash recomputes it -----


def _fused_forward(B, H, Nq, Nk, d, causal, Br, Bc, stored) -> list:
    """attn_flash_fwd<Dt, Br, Bc, stored>: Q once, K and V once per visited tile pair, O and L
    once; stored: S once per visible (i, j). Every visited pair computes a whole Br x Bc x Dt
    tile (4 Br Bc Dt FLOPs: S and P V)."""
    Br, Bc = (Br, Bc) if Br and Bc else fwd_tiles(d)
    Dt, pairs, w = tile_head_dim(d), tile_pairs(Nq, Nk, Br, Bc, causal), BYTES * B * H
    kv = pairs.cols * d
    s = w * visible_pairs(Nq, Nk, causal) if stored else 0
    read = {"Q": w * Nq * d, "K": w * kv, "V": w * kv}
    write = {"O": w * Nq * d, "L": w * Nq, "S": s}
    # K, V: the last Q tile's last row sees key Nk - 1, so some tile loads every row
    unique = ({"Q": w * Nq * d, "K": w * Nk * d, "V": w * Nk * d}, write, {})
    return [_kernel(fwd_name(d, Br, Bc, stored), read, write,
                    flops=B * H * pairs.count * 4 * Br * Bc * Dt, unique=unique)]


def _fused_backward(B, H, Nq, Nk, d, causal, deterministic, Br, Bc, stored) -> list:
    """attn_flash_bwd_preprocess, attn_flash_bwd_dkdv<Dt, Br, Bc, deterministic, stored> and,
    when deterministic, attn_flash_bwd_dq<Dt, Br, Bc, stored>."""
    Br, Bc = (Br, Bc) if Br and Bc else bwd_tiles(d)
    Dt, atomic = tile_head_dim(d), not deterministic  # atomic: dQ += in the dK/dV kernel
    pairs = tile_pairs(Nq, Nk, Br, Bc, causal)
    q_rows = pairs.rows  # Q rows read by dkdv, over all tile pairs
    kv_cols = pairs.cols  # K/V rows read by dq, over all tile pairs
    tiles = pairs.count * Br * Bc * Dt  # multiply-adds of one whole-tile product, all pairs
    w, BH = BYTES * B * H, B * H
    s = w * visible_pairs(Nq, Nk, causal) if stored else 0  # S: each visible entry, once
    seen = Nq - first_seen_row(Nq, Nk, Br, causal)  # Q rows in some visited pair (dkdv)

    out = [_kernel("attn_flash_bwd_preprocess", {"O": w * Nq * d, "dO": w * Nq * d, "D": 0},
                   {"D": w * Nq, "dQ": w * Nq * d if atomic else 0})]
    # dkdv per pair: S (flash only), dP, dV, dK on whole tiles, 2 FLOPs per multiply-add;
    # atomic dQ only on the rows < Nq (the kernel stops there) and all Dt columns
    products = 3 if stored else 4
    k = 0 if stored and deterministic else w * Nk * d  # K serves S = Q K^T and the atomic dQ
    read = {"Q": w * q_rows * d, "K": k, "V": w * Nk * d, "dO": w * q_rows * d,
            "L": w * q_rows, "D": w * q_rows, "S": s}
    unique_read = {"Q": w * seen * d, "K": k, "V": w * Nk * d, "dO": w * seen * d,
                   "L": w * seen, "D": w * seen, "S": s}
    write = {"dQ": 0, "dK": w * Nk * d, "dV": w * Nk * d}
    atomics = {"dQ": BH * q_rows * d if atomic else 0}
    dq_flops = 2 * BH * q_rows * Bc * Dt if atomic else 0
    out.append(_kernel(
        dkdv_name(d, Br, Bc, deterministic, stored), read, write, atomics,
        flops=2 * BH * products * tiles + dq_flops,
        recompute=0 if stored else 2 * BH * tiles,
        unique=(unique_read, write, {"dQ": BYTES * BH * seen * d if atomic else 0})))
    if deterministic:  # dq per pair: S (flash only: again), dP (again), dQ on whole tiles
        products = 2 if stored else 3
        read = {"Q": 0 if stored else w * Nq * d, "K": w * kv_cols * d, "V": w * kv_cols * d,
                "dO": w * Nq * d, "L": w * Nq, "D": w * Nq, "S": s}
        unique_read = dict(read, K=w * Nk * d, V=w * Nk * d)
        out.append(_kernel(
            dq_name(d, Br, Bc, stored), read, {"dQ": w * Nq * d},
            flops=2 * BH * products * tiles, recompute=2 * BH * (products - 1) * tiles,
            unique=(unique_read, {"dQ": w * Nq * d}, {})))
    return out


def flash_forward_traffic(B, H, Nq, Nk, d, causal=False, Br=None, Bc=None) -> list:
    """attn_flash_fwd<Dt, Br, Bc, false>: Q once, K and V once per visited tile pair, O and L
    once, nothing N x N."""
    return _fused_forward(B, H, Nq, Nk, d, causal, Br, Bc, stored=False)


def flash_backward_traffic(B, H, Nq, Nk, d, causal=False, deterministic=False, Br=None,
                           Bc=None) -> list:
    """The flash backward: S = Q K^T recomputed in every tile pair."""
    return _fused_backward(B, H, Nq, Nk, d, causal, deterministic, Br, Bc, stored=False)


def stored_forward_traffic(B, H, Nq, Nk, d, causal=False, Br=None, Bc=None) -> list:
    """attn_flash_fwd<Dt, Br, Bc, true>: the flash forward plus S, one float per visible (i, j)."""
    return _fused_forward(B, H, Nq, Nk, d, causal, Br, Bc, stored=True)


def stored_backward_traffic(B, H, Nq, Nk, d, causal=False, deterministic=False, Br=None,
                            Bc=None) -> list:
    """The stored backward: each kernel reads S once per visible (i, j), no Q K^T."""
    return _fused_backward(B, H, Nq, Nk, d, causal, deterministic, Br, Bc, stored=True)


METHODS = ("naive", "stored", "flash")  # the controlled experiment, one change at a time
VARIANTS = METHODS + ("stored-det", "flash-det")  # "-det": the deterministic dQ backward


def _method(method: str, deterministic: bool) -> tuple:
    if method not in VARIANTS:
        raise ValueError(f"method: expected one of {VARIANTS}, got {method!r}")
    if method.endswith("-det"):
        return method[:-4], True
    return method, bool(deterministic)


def forward_traffic(method: str, B, H, Nq, Nk, d, causal=False) -> list:
    """The modeled launches of one forward of `method` (one of VARIANTS)."""
    method, _ = _method(method, False)
    if method == "naive":
        return naive_forward_traffic(B, H, Nq, Nk, d, causal)
    return _fused_forward(B, H, Nq, Nk, d, causal, None, None, method == "stored")


def backward_traffic(method: str, B, H, Nq, Nk, d, causal=False, deterministic=False) -> list:
    """The modeled launches of one backward of `method` (the naive backward has no atomics:
    deterministic changes nothing there)."""
    method, deterministic = _method(method, deterministic)
    if method == "naive":
        return naive_backward_traffic(B, H, Nq, Nk, d, causal)
    return _fused_backward(B, H, Nq, Nk, d, causal, deterministic, None, None,
                           method == "stored")


def launches(method: str, B, H, Nq, Nk, d, causal=False, deterministic=False) -> list:
    """The modeled KernelTraffic of every launch of one forward + backward of `method`, one of
    METHODS; "stored-det" and "flash-det" stand for deterministic=True."""
    return (forward_traffic(method, B, H, Nq, Nk, d, causal)
            + backward_traffic(method, B, H, Nq, Nk, d, causal, deterministic))


def totals(runs: list) -> dict:
    """Sums over a list of KernelTraffic: bytes read, written, atomic, all, unique; FLOPs;
    recompute."""
    return {
        "bytes_read": sum(x.bytes_read for x in runs),
        "bytes_written": sum(x.bytes_written for x in runs),
        "atomic_bytes": sum(x.atomic_bytes for x in runs),
        "bytes": sum(x.bytes for x in runs),
        "unique_bytes": sum(x.unique_bytes for x in runs),
        "flops": sum(x.flops for x in runs),
        "recompute_flops": sum(x.recompute_flops for x in runs),
    }


# ---- the emulator's example kernels (labs/01: one compute-heavy, one memory-bound) ----------


def sgemm_tiled(M: int, N: int, K: int, tile: int = SGEMM_TILE) -> KernelTraffic:
    """kernels/sgemm_tiled.cu, C = A B: A read ceil(N/tile) times, B ceil(M/tile) times, C
    written once; 2 M N K FLOPs."""
    return _kernel("sgemm_tiled",
                   {"A": BYTES * M * K * ceil_div(N, tile), "B": BYTES * K * N * ceil_div(M, tile)},
                   {"C": BYTES * M * N}, flops=2 * M * N * K,
                   unique=({"A": BYTES * M * K, "B": BYTES * K * N}, {"C": BYTES * M * N}, {}))


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
                   {"C": BYTES * M * N}, flops=2 * M * N * K,
                   unique=({"A": e * M * K, "B": e * K * N}, {"C": BYTES * M * N}, {}))


def softmax_rows(R: int, C: int) -> KernelTraffic:
    """kernels/softmax_rows.cu: x read twice (online max/sum pass, then the output pass), y
    written once. FLOPs: it has no matmul; unlike the attention kernels, its about 5 R C
    pointwise operations (max, 2 exp, fma, scale) are counted, so the roofline can place it."""
    return _kernel("softmax_rows", {"x": 2 * BYTES * R * C}, {"y": BYTES * R * C},
                   flops=5 * R * C, unique=({"x": BYTES * R * C}, {"y": BYTES * R * C}, {}))
