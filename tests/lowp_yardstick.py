"""FlashAttention's low-precision yardstick without PyTorch: attention_ref(upcast=False,
reorder_ops=True) and its autograd backward written out op by op in NumPy, each op computed in
fp32 (as PyTorch's CPU kernels accumulate 16-bit inputs) and its result rounded to the 16-bit
dtype, as PyTorch's 16-bit tensors round every op's output:

    forward   ks = k * scale; S = q ks^T; P = softmax(masked S); A = P * keep / (1 - p); O = A V
    backward  dA = dO V^T; dV = A^T dO; dP = dA / (1 - p) * keep; dS = P * (dP - rowsum(dP P));
              dQ = dS ks; dks = dS^T q; dK = dks * scale

tests/test_attention_tc.py uses PyTorch's own ops where PyTorch is installed and this where it
is not; tests/test_attention_tc.py::test_numpy_yardstick_has_pytorchs_precision holds the two
to the same error against the truth."""

import math

import numpy as np

from ckptlab import reference as ref
from ckptlab import rng


def low_precision(q, k, v, dO, causal, p, seed, offset, npdt):
    """O, dQ, dK, dV (float64 copies) of attention's ops, each rounded to `npdt`."""
    Nq, Nk, d = q.shape[2], k.shape[2], q.shape[3]

    def r(x):  # one op's fp32 result, rounded to the 16-bit dtype
        return np.asarray(x, np.float32).astype(npdt).astype(np.float32)

    q, k, v, dO = (np.asarray(x).astype(np.float32) for x in (q, k, v, dO))
    visible = ref.causal_visible(Nq, Nk) if causal else np.ones((Nq, Nk), bool)
    ks = r(k * np.float32(1.0 / math.sqrt(d)))
    s = r(q @ np.swapaxes(ks, -1, -2))  # (B, H, Nq, Nk)
    s = np.where(visible, s, -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    l = e.sum(-1, keepdims=True)
    P = r(e / np.where(l > 0, l, 1))  # rows that see no key: 0 (FlashAttention's rule)
    keep = rng.keep_mask(seed, offset, P.shape, p).astype(np.float32) if p > 0 else 1.0
    inv = np.float32(1.0 / (1.0 - p))
    A = r(r(P * keep) * inv) if p > 0 else P
    O = r(A @ v)
    dA = r(dO @ np.swapaxes(v, -1, -2))
    dV = r(np.swapaxes(A, -1, -2) @ dO)
    dP = r(r(dA * inv) * keep) if p > 0 else dA
    dS = r(P * (dP - (dP * P).sum(-1, keepdims=True)))
    dS = np.where(visible, dS, 0)
    dQ = r(dS @ ks)
    dK = r(r(np.swapaxes(dS, -1, -2) @ q) * np.float32(1.0 / math.sqrt(d)))
    return [x.astype(np.float64) for x in (O, dQ, dK, dV)]
