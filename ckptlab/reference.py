"""Reference attention in NumPy, float64 by default: the truth the kernels are checked against.

    S = scale * Q K^T          (B, H, Nq, Nk), masked entries -inf
    P = softmax(S)             rows that see no key: P = 0
    O = (P * Z / (1 - p)) V    Z: the dropout keep-mask from ckptlab.rng (same bits as the kernels)
    L = logsumexp(S)           +inf for a row that sees no key (FlashAttention 2's convention)

Backward: dV = P_d^T dO, dP = (dO V^T) * Z / (1 - p), dS = P * (dP - D) with
D = rowsum(dP * P) = rowsum(dO * O), dQ = scale * dS K, dK = scale * dS^T Q.

Two versions: `forward`/`backward` materialise the N x N matrices (the textbook); `tiled_forward`
/`tiled_backward` walk the same tiles as kernels/attn_flash_*.cu (online softmax, then P
recomputed from L per tile), for the notebooks. `dtype=np.float32` runs the same arithmetic in
float32, the yardstick of the "no more than 2x the error of float32" rule.
"""

from __future__ import annotations

import numpy as np

from ckptlab import device, rng


def rel_err(x, truth) -> float:
    """||x - truth|| / ||truth||, in float64: the relative Frobenius error every kernel check
    uses (x may be an array of either target)."""
    x = np.asarray(device.to_numpy(x), np.float64)
    return float(np.linalg.norm(x - truth) / np.linalg.norm(truth))


def default_scale(d: int) -> float:
    """The usual softmax scale 1 / sqrt(d)."""
    return 1.0 / np.sqrt(d)


def causal_visible(Nq: int, Nk: int, xp=np):
    """(Nq, Nk) bool: query i sees key j iff j <= i + Nk - Nq, the causal mask aligned to the
    bottom-right corner (FlashAttention 2.1+). With Nq > Nk the first Nq - Nk rows see nothing.
    `xp`: the array module to build it with (numpy, or cupy for the engine on a GPU)."""
    i = xp.arange(Nq)[:, None]
    j = xp.arange(Nk)[None, :]
    return j <= i + (Nk - Nq)


def dropout_factor(shape, p: float, seed: int, offset: int, dtype=np.float64) -> np.ndarray:
    """Z / (1 - p) for P of `shape` = (B, H, Nq, Nk): 0 where dropped, 1/(1-p) where kept.
    Element ((b*H + h)*Nq + i)*Nk + j uses Philox word (seed, offset, that index)."""
    if p == 0.0:
        return np.ones(shape, dtype=dtype)
    keep = rng.keep_mask(seed, offset, shape, p)
    return keep.astype(dtype) * dtype(1.0 / (1.0 - p))


def _visible(Nq: int, Nk: int, causal: bool) -> np.ndarray:
    return causal_visible(Nq, Nk) if causal else np.ones((Nq, Nk), dtype=bool)


def _as(x, dtype):
    return np.asarray(x).astype(dtype, copy=False)


def probabilities(q, k, causal=False, scale=None, dtype=np.float64):
    """P = softmax(scale * Q K^T) with causal masking, and L = logsumexp of each row.
    Returns P (B, H, Nq, Nk) and L (B, H, Nq)."""
    q, k = _as(q, dtype), _as(k, dtype)
    Nq, Nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = dtype(default_scale(d) if scale is None else scale)
    S = scale * (q @ np.swapaxes(k, -1, -2))  # (B, H, Nq, Nk)
    S = np.where(_visible(Nq, Nk, causal), S, -np.inf)
    m = S.max(axis=-1, keepdims=True)  # (B, H, Nq, 1); -inf for a row that sees no key
    m = np.where(np.isfinite(m), m, 0)  # subtract 0 there: exp(-inf) = 0, not exp(nan)
    E = np.exp(S - m)
    l = E.sum(axis=-1, keepdims=True)
    P = E / np.where(l > 0, l, 1)  # rows that see no key: P = 0
    with np.errstate(divide="ignore"):
        L = np.where(l > 0, m + np.log(l), np.inf)[..., 0]  # (B, H, Nq)
    return P, L


def forward(q, k, v, causal=False, scale=None, dropout_p=0.0, seed=0, offset=0,
            dtype=np.float64):
    """O = dropout(softmax(scale * Q K^T)) V and L = logsumexp(S). Returns (O, L)."""
    P, L = probabilities(q, k, causal, scale, dtype)
    Z = dropout_factor(P.shape, dropout_p, seed, offset, dtype)
    return (P * Z) @ _as(v, dtype), L  # (B, H, Nq, d), (B, H, Nq)


def backward(dO, q, k, v, causal=False, scale=None, dropout_p=0.0, seed=0, offset=0,
             dtype=np.float64):
    """Gradients (dQ, dK, dV) of sum(O * dO) through the textbook N x N formulas."""
    dO, q, k, v = (_as(x, dtype) for x in (dO, q, k, v))
    d = q.shape[-1]
    scale = dtype(default_scale(d) if scale is None else scale)
    P, _ = probabilities(q, k, causal, scale, dtype)  # (B, H, Nq, Nk)
    Z = dropout_factor(P.shape, dropout_p, seed, offset, dtype)
    dV = np.swapaxes(P * Z, -1, -2) @ dO  # dV = P_d^T dO
    dP = (dO @ np.swapaxes(v, -1, -2)) * Z  # dP = (dO V^T) * Z / (1 - p)
    D = (dP * P).sum(axis=-1, keepdims=True)  # D_i = sum_j dP_ij P_ij
    dS = P * (dP - D)  # dS = P * (dP - D)
    dQ = scale * (dS @ k)  # dQ = scale * dS K
    dK = scale * (np.swapaxes(dS, -1, -2) @ q)  # dK = scale * dS^T Q
    return dQ, dK, dV


def _tiles(n: int, size: int):
    """(start, stop) of each tile of `size` covering range(n); the last one may be short."""
    return [(a, min(a + size, n)) for a in range(0, n, size)]


def tiled_forward(q, k, v, causal=False, scale=None, dropout_p=0.0, seed=0, offset=0,
                  Br=64, Bc=32, dtype=np.float64):
    """The forward of attn_flash_fwd.cu, tile by tile: for each Br-row tile of Q, stream the
    Bc-key tiles of K and V, keeping the running row max m and row sum l (online softmax);
    O = acc / l, L = m + log l. Nothing N x N is ever formed. Returns (O, L)."""
    q, k, v = _as(q, dtype), _as(k, dtype), _as(v, dtype)
    B, H, Nq, d = q.shape
    Nk = k.shape[2]
    scale = dtype(default_scale(d) if scale is None else scale)
    O = np.zeros((B, H, Nq, d), dtype)
    L = np.zeros((B, H, Nq), dtype)
    rows = np.arange(Nq)
    for i0, i1 in _tiles(Nq, Br):
        m = np.full((B, H, i1 - i0, 1), -np.inf, dtype)
        l = np.zeros((B, H, i1 - i0, 1), dtype)
        acc = np.zeros((B, H, i1 - i0, d), dtype)
        for j0, j1 in _tiles(Nk, Bc):
            if causal and j0 > i1 - 1 + Nk - Nq:
                break  # this key tile and the ones after it are hidden from every row of the tile
            S = scale * (q[:, :, i0:i1] @ np.swapaxes(k[:, :, j0:j1], -1, -2))  # (B, H, Br, Bc)
            if causal:
                S = np.where(np.arange(j0, j1)[None] <= rows[i0:i1, None] + Nk - Nq, S, -np.inf)
            m_new = np.maximum(m, S.max(axis=-1, keepdims=True))
            m_ref = np.where(np.isfinite(m_new), m_new, 0)  # no visible key yet: exp(-inf) = 0
            alpha = np.exp(m - m_ref)  # rescales what was summed under the old max
            Pt = np.exp(S - m_ref)  # P * l, unnormalised
            l = alpha * l + Pt.sum(axis=-1, keepdims=True)
            Z = _tile_dropout(B, H, Nq, Nk, i0, i1, j0, j1, dropout_p, seed, offset, dtype)
            acc = alpha * acc + (Pt * Z) @ v[:, :, j0:j1]
            m = m_new
        O[:, :, i0:i1] = acc / np.where(l > 0, l, np.inf)  # a row that saw no key: O = 0
        with np.errstate(divide="ignore"):
            L[:, :, i0:i1] = np.where(l > 0, m + np.log(l), np.inf)[..., 0]
    return O, L


def tiled_backward(dO, q, k, v, O, L, causal=False, scale=None, dropout_p=0.0, seed=0,
                   offset=0, Br=32, Bc=32, dtype=np.float64):
    """The backward of attn_flash_bwd.cu, tile by tile: D = rowsum(dO * O); outer loop over
    K/V tiles, inner over Q tiles, P = exp(S - L) recomputed per tile; dK, dV accumulate per
    K/V tile, dQ accumulates across them. Returns (dQ, dK, dV)."""
    dO, q, k, v, O, L = (_as(x, dtype) for x in (dO, q, k, v, O, L))
    B, H, Nq, d = q.shape
    Nk = k.shape[2]
    scale = dtype(default_scale(d) if scale is None else scale)
    D = (dO * O).sum(axis=-1)[..., None]  # (B, H, Nq, 1): D_i = rowsum(dO_i * O_i)
    dQ = np.zeros_like(q)
    dK = np.zeros_like(k)
    dV = np.zeros_like(v)
    rows = np.arange(Nq)
    for j0, j1 in _tiles(Nk, Bc):
        for i0, i1 in _tiles(Nq, Br):
            if causal and j0 > i1 - 1 + Nk - Nq:
                continue  # no row of this Q tile sees any key of this K/V tile
            S = scale * (q[:, :, i0:i1] @ np.swapaxes(k[:, :, j0:j1], -1, -2))  # (B, H, Br, Bc)
            visible = np.ones((i1 - i0, j1 - j0), dtype=bool)
            if causal:
                visible = np.arange(j0, j1)[None] <= rows[i0:i1, None] + Nk - Nq
            P = np.where(visible, np.exp(S - L[:, :, i0:i1, None]), 0)  # P = exp(S - L)
            Z = _tile_dropout(B, H, Nq, Nk, i0, i1, j0, j1, dropout_p, seed, offset, dtype)
            dV[:, :, j0:j1] += np.swapaxes(P * Z, -1, -2) @ dO[:, :, i0:i1]
            dP = (dO[:, :, i0:i1] @ np.swapaxes(v[:, :, j0:j1], -1, -2)) * Z
            dS = P * (dP - D[:, :, i0:i1])  # dS = P * (dP - D)
            dQ[:, :, i0:i1] += scale * (dS @ k[:, :, j0:j1])
            dK[:, :, j0:j1] += scale * (np.swapaxes(dS, -1, -2) @ q[:, :, i0:i1])
    return dQ, dK, dV


def _tile_dropout(B, H, Nq, Nk, i0, i1, j0, j1, p, seed, offset, dtype):
    """Z / (1 - p) for the tile rows i0:i1, columns j0:j1 of P, drawn from the same element
    indices ((b*H + h)*Nq + i)*Nk + j as the whole-matrix mask (a counter-based RNG needs no
    state to jump to a tile)."""
    if p == 0.0:
        return dtype(1.0)
    bh = np.arange(B * H, dtype=np.uint64).reshape(B, H, 1, 1)
    i = np.arange(i0, i1, dtype=np.uint64)[:, None]
    j = np.arange(j0, j1, dtype=np.uint64)[None, :]
    index = (bh * np.uint64(Nq) + i) * np.uint64(Nk) + j  # (B, H, rows, cols)
    words = rng.random_words(seed, offset, index)
    keep = (words >> np.uint32(8)) >= np.uint32(rng.threshold(p))
    return keep.astype(dtype) * dtype(1.0 / (1.0 - p))
