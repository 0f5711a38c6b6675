"""Modeled HBM bytes and FLOPs of the tensor-core attention kernels (kernels/attn_flash_*_tc.cu),
per pointer argument: the formulas of traffic.py's fused kernels with 16-bit elements.

Bytes per (b, h), times B*H: e = 2 bytes for every element of Q, K, V, O, dO and the gradients
(float16 or bfloat16); 4 for L, D, the stored scores S (fp32, one per visible (i, j)), the atomic
dQ's fp32 accumulator dQacc and its atomicAdds. Which tiles are read how often is the fp32
kernels' (pair_counts.tile_pairs over the visited (Q tile, K/V tile) pairs), so at the same
tiles the 16-bit flash pair moves half the bytes of the fp32 one, plus its 4-byte L and D.

FLOPs: tensor-core FLOPs as run, 2 per multiply-add: every visited tile pair computes whole
Br x Bc x Dt blocks (rows past N and the head dim padded to Dt included, causally skipped
tiles excluded). Per pair, in units of 2 Br Bc Dt: forward S and P V (2); dK/dV kernel dP, dV,
dK (3), + S (flash), + dS K (atomic dQ); deterministic dQ kernel dP, dQ (2), + S (flash).
Recompute: S in the flash backward; dP (and, flash, S) again in the deterministic dQ kernel.
"""

from __future__ import annotations

from ckptlab.kernels.table import (
    TC_BWD_TILES,
    TC_FWD_TILES,
    TC_TYPES,
    tc_names,
    tc_tile_head_dim,
)
from ckptlab.measure.pair_counts import first_seen_row, tile_pairs, visible_pairs
from ckptlab.measure.traffic import BYTES, _kernel

METHODS = ("flash", "stored")


def _setup(method, dtype, d):
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    if dtype not in TC_TYPES:
        raise ValueError(f"dtype: expected one of {sorted(TC_TYPES)}, got {dtype!r}")
    return method == "stored", TC_TYPES[dtype], tc_tile_head_dim(d)


def tc_forward_traffic(method, B, H, Nq, Nk, d, causal=False, dtype="bfloat16",
                       tiles=None) -> list:
    """attn_flash_fwd_tc<T, Dt, Br, Bc, stored>: Q once, K and V once per visited tile pair, O
    (e bytes) and L (4) once; stored: S once per visible (i, j), 4 bytes."""
    stored, ctype, Dt = _setup(method, dtype, d)
    Br, Bc = tiles or TC_FWD_TILES[Dt]
    pairs, e, BH = tile_pairs(Nq, Nk, Br, Bc, causal), 2, B * H
    kv = pairs.cols * d
    S = BYTES * BH * visible_pairs(Nq, Nk, causal) if stored else 0
    name = tc_names(ctype, Dt, fwd=(Br, Bc))[f"fwd_{method}"]
    write = {"O": e * BH * Nq * d, "L": BYTES * BH * Nq, "S": S}
    # unique: the last Q tile's last row sees key Nk - 1, so some tile loads every K, V row
    unique = ({"Q": e * BH * Nq * d, "K": e * BH * Nk * d, "V": e * BH * Nk * d}, write, {})
    return [_kernel(name, {"Q": e * BH * Nq * d, "K": e * BH * kv, "V": e * BH * kv}, write,
                    flops=BH * pairs.count * 2 * (2 * Br * Bc * Dt), unique=unique)]


def tc_backward_traffic(method, B, H, Nq, Nk, d, causal=False, deterministic=False,
                        dtype="bfloat16", tiles=None) -> list:
    """attn_flash_bwd_preprocess_tc, attn_flash_bwd_dkdv_tc<..., deterministic, stored>, then
    attn_flash_bwd_dq_tc<..., stored> (deterministic) or attn_flash_bwd_dq_convert_tc."""
    stored, ctype, Dt = _setup(method, dtype, d)
    Br, Bc = tiles or TC_BWD_TILES[Dt]
    names = tc_names(ctype, Dt, bwd=(Br, Bc))
    atomic, e, BH, w = not deterministic, 2, B * H, BYTES * B * H
    pairs = tile_pairs(Nq, Nk, Br, Bc, causal)
    q_rows = pairs.rows  # Q, dO, L, D rows read by dkdv over all pairs
    kv_cols = pairs.cols  # K, V rows read by dq over all pairs
    block = BH * pairs.count * 2 * Br * Bc * Dt  # one whole-tile product over all pairs
    S = w * visible_pairs(Nq, Nk, causal) if stored else 0  # each kernel reads S once
    seen = Nq - first_seen_row(Nq, Nk, Br, causal)  # Q rows in some visited pair (dkdv)
    out = [_kernel(names["preprocess"], {"O": e * BH * Nq * d, "dO": e * BH * Nq * d, "D": 0},
                   {"D": w * Nq, "dQacc": w * Nq * d if atomic else 0})]
    K = 0 if stored and deterministic else e * BH * Nk * d  # K: S = Q K^T and the atomic dQ
    write = {"dQacc": 0, "dK": e * BH * Nk * d, "dV": e * BH * Nk * d}
    unique = ({"Q": e * BH * seen * d, "K": K, "V": e * BH * Nk * d, "dO": e * BH * seen * d,
               "L": w * seen, "D": w * seen, "S": S}, write,
              {"dQacc": w * seen * d if atomic else 0})
    out.append(_kernel(
        names[f"dkdv_{method}_{deterministic}"],
        {"Q": e * BH * q_rows * d, "K": K, "V": e * BH * Nk * d, "dO": e * BH * q_rows * d,
         "L": w * q_rows, "D": w * q_rows, "S": S}, write,
        {"dQacc": BH * q_rows * d if atomic else 0},
        flops=block * (3 + (not stored) + atomic), recompute=0 if stored else block,
        unique=unique))
    if deterministic:
        read = {"Q": 0 if stored else e * BH * Nq * d, "K": e * BH * kv_cols * d,
                "V": e * BH * kv_cols * d, "dO": e * BH * Nq * d, "L": w * Nq, "D": w * Nq,
                "S": S}
        out.append(_kernel(
            names[f"dq_{method}"], read, {"dQ": e * BH * Nq * d},
            flops=block * (2 + (not stored)), recompute=block * (1 + (not stored)),
            unique=(dict(read, K=e * BH * Nk * d, V=e * BH * Nk * d), {"dQ": e * BH * Nq * d},
                    {})))
    else:
        out.append(_kernel(names["convert"], {"dQacc": w * Nq * d}, {"dQ": e * BH * Nq * d}))
    return out


def tc_launches(method, B, H, Nq, Nk, d, causal=False, deterministic=False,
                dtype="bfloat16") -> list:
    """The modeled launches of one forward + backward of `method` on tensor cores."""
    return (tc_forward_traffic(method, B, H, Nq, Nk, d, causal, dtype)
            + tc_backward_traffic(method, B, H, Nq, Nk, d, causal, deterministic, dtype))
