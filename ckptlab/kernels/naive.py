"""Launch wrappers for standard attention: S and P in HBM (kernels/attn_naive_fwd.cu, _bwd.cu).

    O, saved = naive_forward(q, k, v, causal=False, scale=None, dropout_p=0.0, seed=0, offset=0)
    dq, dk, dv = naive_backward(dO, q, k, v, saved)

Arrays are fp32 (B, H, N, d), C-contiguous, of the current target. The forward keeps P
(B, H, Nq, Nk) for the backward (`saved`, a common.Saved). The math: the .cu files' headers.
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
    dropout_args,
    poisoned,
)
from ckptlab.kernels.table import NAIVE_TILE, SOFTMAX_ROWS


def naive_forward(q, k, v, causal=False, scale=None, dropout_p=0.0, seed=0, offset=0):
    """Standard attention, three launches: S = scale Q K^T, P = softmax(S), O = dropout(P) V.
    S and P go through HBM; P (B, H, Nq, Nk) is kept for the backward."""
    B, H, Nq, Nk, d = check_qkv(q, k, v)
    causal, scale, p, seed, offset = check_options(causal, scale, dropout_p, seed, offset, d)
    S = poisoned((B, H, Nq, Nk))  # (B, H, Nq, Nk), a temporary
    P = poisoned((B, H, Nq, Nk))  # (B, H, Nq, Nk), saved
    O = poisoned((B, H, Nq, d))  # (B, H, Nq, d)
    mod = device.load("attn_naive_fwd.cu")
    T, n = NAIVE_TILE, (np.int32(Nq), np.int32(Nk), np.int32(d))
    mod.get_function("attn_naive_scores")(
        (ceil_div(Nk, T), ceil_div(Nq, T), B * H), (T, T),
        (q, k, S, *n, np.float32(scale), np.int32(causal)))
    mod.get_function("attn_naive_softmax")(
        (ceil_div(Nq, SOFTMAX_ROWS), B * H), (32, SOFTMAX_ROWS), (S, P, n[0], n[1]))
    mod.get_function("attn_naive_pv")(
        (ceil_div(d, T), ceil_div(Nq, T), B * H), (T, T), (P, v, O, *n,
                                                            *dropout_args(p, seed, offset)))
    saved = Saved("naive", {"P": P}, causal, scale, p, seed, offset, (B, H, Nq, Nk, d))
    return O, saved


def naive_backward(dO, q, k, v, saved):
    """The store-P backward, five launches: dV = P_d^T dO, dP = (dO V^T) Z/(1-p),
    dS = P (dP - D), dQ = scale dS K, dK = scale dS^T Q; dP and dS go through HBM."""
    B, H, Nq, Nk, d = check_qkv(q, k, v)
    check_array("dO", dO, (B, H, Nq, d))
    check_saved(saved, "naive", B, H, Nq, Nk, d)
    P = saved.tensors["P"]
    dP = poisoned((B, H, Nq, Nk))  # (B, H, Nq, Nk), a temporary
    dS = poisoned((B, H, Nq, Nk))  # (B, H, Nq, Nk), a temporary
    dQ, dK, dV = poisoned(q.shape), poisoned(k.shape), poisoned(v.shape)
    mod = device.load("attn_naive_bwd.cu")
    T, n = NAIVE_TILE, (np.int32(Nq), np.int32(Nk), np.int32(d))
    drop = dropout_args(saved.dropout_p, saved.seed, saved.offset)
    scale = np.float32(saved.scale)
    mod.get_function("attn_naive_bwd_dv")(
        (ceil_div(d, T), ceil_div(Nk, T), B * H), (T, T), (P, dO, dV, *n, *drop))
    mod.get_function("attn_naive_bwd_dp")(
        (ceil_div(Nk, T), ceil_div(Nq, T), B * H), (T, T), (dO, v, dP, *n, *drop))
    mod.get_function("attn_naive_bwd_ds")(
        (ceil_div(Nq, SOFTMAX_ROWS), B * H), (32, SOFTMAX_ROWS), (P, dP, dS, n[0], n[1]))
    mod.get_function("attn_naive_bwd_dq")(
        (ceil_div(d, T), ceil_div(Nq, T), B * H), (T, T), (dS, k, dQ, *n, scale))
    mod.get_function("attn_naive_bwd_dk")(
        (ceil_div(d, T), ceil_div(Nk, T), B * H), (T, T), (dS, q, dK, *n, scale))
    return dQ, dK, dV
