"""Launch wrappers for FlashAttention: nothing N x N in HBM (kernels/attn_flash_fwd.cu, _bwd.cu).

    O, saved = flash_forward(q, k, v, causal=False, scale=None, dropout_p=0.0, seed=0, offset=0)
    dq, dk, dv = flash_backward(dO, q, k, v, saved, deterministic=False)

Arrays are fp32 (B, H, N, d), C-contiguous, of the current target. The forward keeps exactly
O and L = m + log l (B, H, Nq); the backward recomputes P = exp(S - L) tile by tile.
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
    BWD_TILES,
    FWD_TILES,
    LANES,
    SOFTMAX_ROWS,
    flash_bwd_shared_bytes,
    flash_fwd_shared_bytes,
    instantiations,
    template_name,
)


def _flash_module(filename: str, wanted: tuple, defaults: list):
    """Load a templated kernel file once with every default instantiation (one compile for all
    head dims), or with just the `wanted` ones when they are not defaults (custom tiles)."""
    names = tuple(defaults) if all(w in defaults for w in wanted) else tuple(wanted)
    return device.load(filename, name_expressions=names)


def flash_forward(q, k, v, causal=False, scale=None, dropout_p=0.0, seed=0, offset=0, *,
                  tiles=None):
    """FlashAttention forward, one launch: tiled online softmax; writes O and L only.
    `tiles` = (Br, Bc) overrides FWD_TILES[d] (multiples of 8, shared memory <= 48 KiB)."""
    B, H, Nq, Nk, d = check_qkv(q, k, v)
    causal, scale, p, seed, offset = check_options(causal, scale, dropout_p, seed, offset, d)
    Br, Bc = check_tiles(tiles or FWD_TILES[d], d, flash_fwd_shared_bytes, "forward")
    O = poisoned((B, H, Nq, d))  # (B, H, Nq, d)
    L = poisoned((B, H, Nq))  # (B, H, Nq)
    name = template_name("attn_flash_fwd", d, Br, Bc)
    defaults = instantiations("attn_flash_fwd.cu")
    kernel = _flash_module("attn_flash_fwd.cu", (name,), defaults).get_function(name)
    kernel((ceil_div(Nq, Br), B * H), (LANES, Br),
           (q, k, v, O, L, np.int32(Nq), np.int32(Nk), np.float32(scale), np.int32(causal),
            *dropout_args(p, seed, offset)))
    saved = Saved("flash", {"O": O, "L": L}, causal, scale, p, seed, offset, (B, H, Nq, Nk, d))
    return O, saved


def flash_backward(dO, q, k, v, saved, deterministic=False, *, tiles=None):
    """FlashAttention backward: D = rowsum(dO * O), then the K/V-outer, Q-inner loop that
    recomputes P = exp(S - L) per tile. dQ by atomicAdd (FA2), or with deterministic=True by
    a second kernel that loops over K/V tiles per Q tile (no atomics, bitwise reproducible).
    `tiles` = (Br, Bc) overrides BWD_TILES[d]."""
    B, H, Nq, Nk, d = check_qkv(q, k, v)
    check_array("dO", dO, (B, H, Nq, d))
    check_saved(saved, "flash", B, H, Nq, Nk, d)
    if not isinstance(deterministic, (bool, np.bool_)):
        raise TypeError(f"deterministic must be a bool, got {deterministic!r}")
    Br, Bc = check_tiles(tiles or BWD_TILES[d], d, flash_bwd_shared_bytes, "backward")
    if Br > Bc * LANES:  # attn_flash_bwd_dkdv loads L and D with one thread per query row
        raise ValueError(f"backward tiles (Br, Bc) = ({Br}, {Bc}): Br must be at most "
                         f"Bc * {LANES} = {Bc * LANES} (the dK/dV block has Bc * {LANES} threads)")
    O, L = saved.tensors["O"], saved.tensors["L"]
    D = poisoned((B, H, Nq))  # (B, H, Nq): D_i = rowsum(dO_i * O_i), a temporary
    dQ, dK, dV = poisoned(q.shape), poisoned(k.shape), poisoned(v.shape)
    deterministic = bool(deterministic)
    dkdv = template_name("attn_flash_bwd_dkdv", d, Br, Bc, deterministic)
    dq = template_name("attn_flash_bwd_dq", d, Br, Bc)
    defaults = instantiations("attn_flash_bwd.cu")
    mod = _flash_module("attn_flash_bwd.cu", (dkdv, dq) if deterministic else (dkdv,), defaults)
    rows = B * H * Nq
    mod.get_function("attn_flash_bwd_preprocess")(
        (ceil_div(rows, SOFTMAX_ROWS),), (32, SOFTMAX_ROWS),
        (O, dO, D, dQ, np.int32(rows), np.int32(d), np.int32(deterministic)))
    args = (np.int32(Nq), np.int32(Nk), np.float32(saved.scale), np.int32(saved.causal),
            *dropout_args(saved.dropout_p, saved.seed, saved.offset))
    mod.get_function(dkdv)((ceil_div(Nk, Bc), B * H), (LANES, Bc),
                           (q, k, v, dO, L, D, dQ, dK, dV, *args))
    if deterministic:
        mod.get_function(dq)((ceil_div(Nq, Br), B * H), (LANES, Br),
                             (q, k, v, dO, L, D, dQ, *args))
    return dQ, dK, dV
