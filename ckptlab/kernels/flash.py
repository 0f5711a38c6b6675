"""Launch wrappers for the fused attention pair (kernels/attn_flash_fwd.cu, _bwd.cu), flash
method: nothing N x N in HBM.

    O, saved = flash_forward(q, k, v, causal=False, scale=None, dropout_p=0.0, seed=0, offset=0)
    dq, dk, dv = flash_backward(dO, q, k, v, saved, deterministic=False)

Arrays are fp32 (B, H, N, d), C-contiguous, of the current target, any head dim d that is a
multiple of 8 up to 256. The forward keeps exactly O and L = m + log l (B, H, Nq); the backward
recomputes P = exp(S - L) tile by tile. The store-P method (stored.py) launches the same
kernels with the template switch STORED = true; fused_forward / fused_backward do both.
"""

from __future__ import annotations

import numpy as np

from ckptlab import device
from ckptlab.kernels.common import (
    Saved,
    ceil_div,
    check_array,
    check_options,
    check_qkv,
    check_saved,
    check_tiles,
    dropout_args,
    poisoned,
)
from ckptlab.kernels.table import (
    LANES,
    SOFTMAX_ROWS,
    bwd_tiles,
    dkdv_name,
    dq_name,
    flash_bwd_shared_bytes,
    flash_fwd_shared_bytes,
    fwd_name,
    fwd_tiles,
    instantiations,
    tile_head_dim,
)


def _module(filename: str, d: int, wanted: tuple):
    """Load a templated kernel file once per tile head dim with every default instantiation of
    that tile head dim (flash and stored, both dQ modes: one compile), or with just the
    `wanted` ones when they are not defaults (custom tiles)."""
    defaults = instantiations(filename, (tile_head_dim(d),))
    names = tuple(defaults) if all(w in defaults for w in wanted) else tuple(wanted)
    return device.load(filename, name_expressions=names)


def fused_forward(method: str, q, k, v, causal, scale, dropout_p, seed, offset, tiles):
    """One launch of attn_flash_fwd<Dt, Br, Bc, method == "stored">; O and the Saved state."""
    stored = method == "stored"
    B, H, Nq, Nk, d = check_qkv(q, k, v)
    causal, scale, p, seed, offset = check_options(causal, scale, dropout_p, seed, offset, d)
    Br, Bc = check_tiles(tiles or fwd_tiles(d), d, flash_fwd_shared_bytes, "forward")
    O = poisoned((B, H, Nq, d))  # (B, H, Nq, d)
    L = poisoned((B, H, Nq))  # (B, H, Nq)
    # stored: S (B, H, Nq, Nk), written on visible (i, j) only (the rest stays NaN); flash: none
    S = poisoned((B, H, Nq, Nk) if stored else (0,))
    name = fwd_name(d, Br, Bc, stored)
    kernel = _module("attn_flash_fwd.cu", d, (name,)).get_function(name)
    kernel((ceil_div(Nq, Br), B * H), (LANES, Br),
           (q, k, v, O, L, S, np.int32(Nq), np.int32(Nk), np.int32(d), np.float32(scale),
            np.int32(causal), *dropout_args(p, seed, offset)))
    tensors = {"O": O, "L": L, "S": S} if stored else {"O": O, "L": L}
    return O, Saved(method, tensors, causal, scale, p, seed, offset, (B, H, Nq, Nk, d))


def fused_backward(method: str, dO, q, k, v, saved, deterministic, tiles):
    """preprocess, dkdv<..., deterministic, stored> and, if deterministic, dq<..., stored>."""
    stored = method == "stored"
    B, H, Nq, Nk, d = check_qkv(q, k, v)
    check_array("dO", dO, (B, H, Nq, d))
    check_saved(saved, method, B, H, Nq, Nk, d)
    if not isinstance(deterministic, (bool, np.bool_)):
        raise TypeError(f"deterministic must be a bool, got {deterministic!r}")
    Br, Bc = check_tiles(tiles or bwd_tiles(d), d, flash_bwd_shared_bytes, "backward")
    if Br > Bc * LANES:  # attn_flash_bwd_dkdv loads L and D with one thread per query row
        raise ValueError(f"backward tiles (Br, Bc) = ({Br}, {Bc}): Br must be at most "
                         f"Bc * {LANES} = {Bc * LANES} (the dK/dV block has Bc * {LANES} threads)")
    O, L = saved.tensors["O"], saved.tensors["L"]
    S = saved.tensors["S"] if stored else device.xp().empty((0,), np.float32)
    D = poisoned((B, H, Nq))  # (B, H, Nq): D_i = rowsum(dO_i * O_i), a temporary
    dQ, dK, dV = poisoned(q.shape), poisoned(k.shape), poisoned(v.shape)
    deterministic = bool(deterministic)
    dkdv = dkdv_name(d, Br, Bc, deterministic, stored)
    dq = dq_name(d, Br, Bc, stored)
    mod = _module("attn_flash_bwd.cu", d, (dkdv, dq) if deterministic else (dkdv,))
    rows = B * H * Nq
    mod.get_function("attn_flash_bwd_preprocess")(
        (ceil_div(rows, SOFTMAX_ROWS),), (32, SOFTMAX_ROWS),
        (O, dO, D, dQ, np.int32(rows), np.int32(d), np.int32(deterministic)))
    args = (np.int32(Nq), np.int32(Nk), np.int32(d), np.float32(saved.scale),
            np.int32(saved.causal), *dropout_args(saved.dropout_p, saved.seed, saved.offset))
    mod.get_function(dkdv)((ceil_div(Nk, Bc), B * H), (LANES, Bc),
                           (q, k, v, dO, L, D, S, dQ, dK, dV, *args))
    if deterministic:
        mod.get_function(dq)((ceil_div(Nq, Br), B * H), (LANES, Br),
                             (q, k, v, dO, L, D, S, dQ, *args))
    return dQ, dK, dV


def flash_forward(q, k, v, causal=False, scale=None, dropout_p=0.0, seed=0, offset=0, *,
                  tiles=None):
    """FlashAttention forward, one launch: tiled online softmax; writes O and L only.
    `tiles` = (Br, Bc) overrides the default of table.fwd_tiles(d) (multiples of 8, shared
    memory <= 48 KiB)."""
    return fused_forward("flash", q, k, v, causal, scale, dropout_p, seed, offset, tiles)


def flash_backward(dO, q, k, v, saved, deterministic=False, *, tiles=None):
    """FlashAttention backward: D = rowsum(dO * O), then the K/V-outer, Q-inner loop that
    recomputes P = exp(S - L) per tile. dQ by atomicAdd (FA2), or with deterministic=True by
    a second kernel that loops over K/V tiles per Q tile (no atomics, bitwise reproducible).
    `tiles` = (Br, Bc) overrides table.bwd_tiles(d)."""
    return fused_backward("flash", dO, q, k, v, saved, deterministic, tiles)
