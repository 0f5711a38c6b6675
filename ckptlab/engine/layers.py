"""Layer ops of the engine: layernorm, dropout, cross-entropy, embedding lookup and attention
(naive: saves P; stored: saves S, O and the logsumexp L, forms P = exp(S - L) in backward;
flash: saves O and L and recomputes S = Q K^T, then P, in backward).

Same rules as ckptlab.engine.tensor: closures capture Nodes, shapes and saved arrays only, and
accumulate into their inputs' gradients. Dropout masks come from Philox (ckptlab.rng) keyed by
the engine's (seed, offset), so a recompute that restores the RNG state redraws the same mask.
"""

from __future__ import annotations

import math

import numpy as np

from ckptlab import kernels, rng
from ckptlab.engine import tape
from ckptlab.engine.arrays import xp_of
from ckptlab.engine.tensor import Tensor, make
from ckptlab.measure import traffic
from ckptlab.reference import causal_visible


def layernorm(x: Tensor, w: Tensor | None = None, b: Tensor | None = None,
              eps: float = 1e-5) -> Tensor:
    """Over the last axis: xhat = (x - mean) * rstd, rstd = 1/sqrt(var + eps); y = xhat w + b.
    dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = g w; dw = sum(g xhat);
    db = sum(g). Saves xhat and rstd (not x)."""
    D = x.shape[-1]
    for name, p in (("w", w), ("b", b)):
        if p is not None and p.shape != (D,):
            raise ValueError(f"layernorm: {name} of shape {p.shape} for x {x.shape}; "
                             f"expected ({D},)")
    xp = xp_of(x.data)
    mu = x.data.mean(axis=-1, keepdims=True)  # (..., 1)
    xc = x.data - mu
    rstd = 1.0 / xp.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)  # (..., 1)
    xhat = xc * rstd  # (..., D)
    y = xhat if w is None else xhat * w.data
    y = y if b is None else y + b.data
    tape.count(8 * x.size)
    xn, wn = x.node, (w.node if w is not None else None)
    bn, Wd = (b.node if b is not None else None), (w.data if w is not None else None)

    def backward(g):
        lead = tuple(range(g.ndim - 1))
        if wn is not None:
            wn.add_grad((g * xhat).sum(axis=lead))
        if bn is not None:
            bn.add_grad(g.sum(axis=lead))
        if xn is not None:
            dxhat = g if Wd is None else g * Wd
            dx = rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True)
                         - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
            xn.add_grad(dx)
        tape.count(10 * g.size)

    inputs = tuple(t for t in (x, w, b) if t is not None)
    return make(y, "layernorm", inputs, backward, saved=(xhat, rstd, w))


def keep_mask(seed: int, offset: int, shape, p: float, xp=np):
    """rng.keep_mask on the array module `xp` (the mask is drawn on the host)."""
    m = rng.keep_mask(seed, offset, shape, p)
    return m if xp is np else xp.asarray(m)


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """y = x * keep / (1 - p), keep from Philox keyed by the engine's (seed, offset), which
    advances by one per call; p == 0 (or not training) is the identity and draws nothing.
    Saves the boolean mask (1 byte per element)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout: p must be in [0, 1), got {p}")
    if p == 0.0 or not training:
        return x
    seed, offset = tape.next_rng()
    xp, xn = xp_of(x.data), x.node
    keep = keep_mask(seed, offset, x.shape, p, xp)  # (x.shape) bool
    scale = 1.0 / (1.0 - p)
    y = xp.where(keep, x.data * scale, 0.0).astype(x.dtype, copy=False)
    tape.count(2 * x.size)

    def backward(g):
        xn.add_grad(xp.where(keep, g * scale, 0.0).astype(g.dtype, copy=False))
        tape.count(2 * g.size)

    return make(y, "dropout", (x,), backward, saved=(keep,))


def cross_entropy(logits: Tensor, targets) -> Tensor:
    """Mean over rows of -log softmax(logits)[target]; dlogits = (softmax - onehot) g / n.
    logits (..., C), targets integer (...). Saves the probabilities."""
    t = targets.data if isinstance(targets, Tensor) else targets
    xp = xp_of(logits.data)
    t = xp.asarray(t)
    if t.dtype.kind not in "iu" or t.shape != logits.shape[:-1]:
        raise ValueError(f"cross_entropy: targets {t.shape} ({t.dtype}) for logits "
                         f"{logits.shape}; expected integers of shape {logits.shape[:-1]}")
    C = logits.shape[-1]
    z = logits.data.reshape(-1, C)  # (n, C)
    tt = t.reshape(-1)
    if tt.size and (int(tt.min()) < 0 or int(tt.max()) >= C):
        raise ValueError(f"cross_entropy: targets must be in [0, {C}), got [{int(tt.min())}, "
                         f"{int(tt.max())}]")
    n, rows = z.shape[0], xp.arange(z.shape[0])
    z = z - z.max(axis=1, keepdims=True)
    lse = xp.log(xp.exp(z).sum(axis=1, keepdims=True))  # (n, 1)
    logp = z - lse  # (n, C)
    loss = -logp[rows, tt].mean()
    probs = xp.exp(logp)
    tape.count(5 * z.size)
    xn, shape = logits.node, logits.shape

    def backward(g):
        d = probs.copy()
        d[xp.arange(n), tt] -= 1.0
        xn.add_grad((d * (g / n)).reshape(shape))
        tape.count(2 * d.size)

    return make(xp.asarray(loss), "cross_entropy", (logits,), backward, saved=(probs, tt))


def embedding(W: Tensor, idx) -> Tensor:
    """y = W[idx] (rows of a (V, D) table); dW[v] = sum of g over positions with idx == v."""
    i = idx.data if isinstance(idx, Tensor) else idx
    xp = xp_of(W.data)
    i = xp.asarray(i)
    if W.ndim != 2 or i.dtype.kind not in "iu":
        raise ValueError(f"embedding: expected a (V, D) table and integer indices, got W "
                         f"{W.shape} and idx {i.shape} ({i.dtype})")
    if i.size and (int(i.min()) < 0 or int(i.max()) >= W.shape[0]):
        raise ValueError(f"embedding: indices must be in [0, {W.shape[0]}), got "
                         f"[{int(i.min())}, {int(i.max())}]")
    Wn, shape = W.node, W.shape
    y = tape.compute("embedding", lambda: W.data[i], i.size * W.shape[1])

    def backward(g):
        dW = xp.zeros(shape, dtype=g.dtype)
        xp.add.at(dW, i, g)  # sequential scatter-add: deterministic on the CPU
        Wn.add_grad(dW)
        tape.count(g.size)

    return make(y, "embedding", (W,), backward, saved=(i,))


# ------------------------------------------------------------------------------ attention


def _softmax_lse(S, allowed, xp):
    """P = softmax(S) over keys and L = m + log l per row; a fully masked row gets P = 0 and
    L = +inf, so that exp(S - L) = 0 there too."""
    if allowed is not None:
        S = xp.where(allowed, S, -xp.inf)
    m = S.max(axis=-1, keepdims=True)  # (B, H, Nq, 1)
    m = xp.where(xp.isfinite(m), m, 0.0)
    E = xp.exp(S - m)  # (B, H, Nq, Nk); 0 where masked
    l = E.sum(axis=-1, keepdims=True)
    P = E / xp.where(l > 0, l, 1.0)
    L = xp.where(l > 0, m + xp.log(xp.where(l > 0, l, 1.0)), xp.inf)[..., 0]  # (B, H, Nq)
    return P, L


def _check_attention(q, k, v, impl, backend, dropout_p):
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"attention: expected q, k, v of shape (B, H, N, d), got q {q.shape}, "
                         f"k {k.shape}, v {v.shape}")
    if q.shape[:2] != k.shape[:2] or k.shape[:3] != v.shape[:3] or q.shape[3] != k.shape[3]:
        raise ValueError(f"attention: q {q.shape}, k {k.shape}, v {v.shape} do not fit: need "
                         "equal (B, H), k and v with the same N, q and k with the same d")
    if impl not in kernels.METHODS:
        raise ValueError(f"attention: impl must be one of {kernels.METHODS}, got {impl!r}")
    if backend not in ("numpy", "kernels"):
        raise ValueError(f"attention: backend must be 'numpy' or 'kernels', got {backend!r}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"attention: dropout_p must be in [0, 1), got {dropout_p}")


def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, impl: str = "naive",
              dropout_p: float = 0.0, scale: float | None = None,
              backend: str = "numpy") -> Tensor:
    """O = dropout(softmax(scale Q K^T)) V on (B, H, N, d) tensors.

    What each method saves for the backward (the ledger) and recomputes in it:
        impl="naive"   P (B, H, Nq, Nk); nothing recomputed
        impl="stored"  S = scale Q K^T (B, H, Nq, Nk), O and L = m + log l (B, H, Nq); the
                       backward forms P = exp(S - L), never Q K^T
        impl="flash"   O and L; the backward recomputes S = scale Q K^T, then P = exp(S - L)
                       (those FLOPs count as "recompute")
    backend="numpy": this module, in the inputs' dtype (gradcheck runs it in float64);
    backend="kernels": the CUDA kernels through ckptlab.kernels (fp32, the emulator on the CPU).
    Under tape.recomputing({"attention"}) (numpy backend) every impl saves only q, k, v and its
    backward recomputes S and P ("recompute" FLOPs): Korthikanti et al.'s selective recompute.
    Dropout element (b, h, i, j) is number ((b*H + h)*Nq + i)*Nk + j of rng.keep_mask.
    FLOPs follow ckptlab.measure.traffic's one convention: matmul FLOPs, 2 per multiply-add,
    as run (exp, max, sums not counted). NumPy runs dense matmuls (masked scores included):
    4 B H Nq Nk d forward, 8 backward, plus 2 B H Nq Nk d recompute for flash; the kernels
    count what traffic models for their launches (tiles, padding, causal skipping)."""
    _check_attention(q, k, v, impl, backend, dropout_p)
    B, H, Nq, d = q.shape
    Nk = k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    seed, offset = tape.next_rng() if dropout_p > 0 else (0, 0)
    if backend == "kernels":
        if "attention" in tape.recompute_ops():
            raise ValueError("attention: recomputing the core (tape.recomputing) runs on "
                             "backend='numpy' only; the kernels keep P (naive), S, O and L "
                             "(stored) or O and L (flash)")
        return _attention_kernels(q, k, v, causal, impl, dropout_p, scale, seed, offset)
    mm = 2 * B * H * Nq * Nk * d  # FLOPs of one (Nq x d) @ (d x Nk) matmul per head
    xp = xp_of(q.data)
    Q, K, V = q.data, k.data, v.data
    allowed = causal_visible(Nq, Nk, xp) if causal else None
    S = (Q @ K.swapaxes(-1, -2)) * scale  # (B, H, Nq, Nk)
    P, L = _softmax_lse(S, allowed, xp)  # (B, H, Nq, Nk), (B, H, Nq)
    keep = keep_mask(seed, offset, P.shape, dropout_p, xp) if dropout_p > 0 else None
    drop = 1.0 / (1.0 - dropout_p)
    O = (P if keep is None else xp.where(keep, P * drop, 0.0)) @ V  # (B, H, Nq, d)
    tape.count(2 * mm)
    qn, kn, vn = q.node, k.node, v.node
    # What the closure may see: naive keeps P; stored S, O and L; flash O and L (none the mask);
    # the core recomputed (Korthikanti's selective recompute) keeps nothing beyond q, k, v
    core = "attention" in tape.recompute_ops()
    P_saved = P if impl == "naive" and not core else None
    S_saved = S if impl == "stored" and not core else None
    O_saved, L_saved = (None, None) if impl == "naive" or core else (O, L)

    def backward(g):  # g = dO
        Pb, Sb, O_kept, L_kept = P_saved, S_saved, O_saved, L_saved
        if core:  # the forward's core again from q, k, v: S, P = softmax(S); fused: L and O
            Sb = (Q @ K.swapaxes(-1, -2)) * scale
            visible = causal_visible(Nq, Nk, xp) if causal else None  # rebuilt: never held
            Pb, L_kept = _softmax_lse(Sb, visible, xp)
            tape.count(mm, "recompute")
            if impl != "naive":  # the fused backward reads O (for D) and L: O = dropout(P) V
                k_ = keep_mask(seed, offset, Pb.shape, dropout_p, xp) if dropout_p > 0 else None
                O_kept = (Pb if k_ is None else xp.where(k_, Pb * drop, 0.0)) @ V
                tape.count(mm, "recompute")
        if impl == "flash":  # S = scale Q K^T: recomputed, never stored
            Sb = (Q @ K.swapaxes(-1, -2)) * scale
            tape.count(mm, "recompute")
        if impl != "naive":  # stored: S read back from what the forward saved
            if causal:
                Sb = xp.where(causal_visible(Nq, Nk, xp), Sb, -xp.inf)
            Pb = xp.exp(Sb - L_kept[..., None])  # P = exp(S - L)
        mask = keep_mask(seed, offset, Pb.shape, dropout_p, xp) if dropout_p > 0 else None
        Pd = Pb if mask is None else xp.where(mask, Pb * drop, 0.0)  # what O = Pd V used
        dP = g @ V.swapaxes(-1, -2)  # (B, H, Nq, Nk): d(Pd)
        if mask is not None:
            dP = xp.where(mask, dP * drop, 0.0)  # dP = dPd * keep / (1 - p)
        # D_i = rowsum(dO_i * O_i) = rowsum(P_i * dP_i); stored and flash read O, naive has P
        if impl == "naive":
            D = (Pb * dP).sum(-1, keepdims=True)  # (B, H, Nq, 1)
        else:
            D = (g * O_kept).sum(-1, keepdims=True)
        dS = Pb * (dP - D)  # dS = P * (dP - D)
        if vn is not None:
            vn.add_grad(Pd.swapaxes(-1, -2) @ g)  # dV = P^T dO
        if qn is not None:
            qn.add_grad((dS @ K) * scale)  # dQ = scale dS K
        if kn is not None:
            kn.add_grad((dS.swapaxes(-1, -2) @ Q) * scale)  # dK = scale dS^T Q
        tape.count(4 * mm)

    saved = (q, k, v, P_saved, S_saved, O_saved, L_saved)
    return make(O, "attention", (q, k, v), backward, saved=saved)


def _attention_kernels(q, k, v, causal, impl, p, scale, seed, offset):
    """The same op through ckptlab.kernels's launch wrappers (fp32 on the current target);
    FLOPs as traffic models the launches (hardware, recompute apart)."""
    xp = xp_of(q.data)
    Q, K, V = (xp.ascontiguousarray(t.data, dtype=xp.float32) for t in (q, k, v))
    B, H, Nq, d = Q.shape
    Nk = K.shape[2]
    O, state = kernels.forward(impl, Q, K, V, causal=causal, scale=scale, dropout_p=p, seed=seed,
                               offset=offset)
    if not hasattr(state, "nbytes"):
        raise TypeError(f"attention.{impl}_forward returned saved state without .nbytes: "
                        f"{type(state).__name__}")
    fwd = traffic.totals(traffic.forward_traffic(impl, B, H, Nq, Nk, d, causal))
    bwd = traffic.totals(traffic.backward_traffic(impl, B, H, Nq, Nk, d, causal))
    tape.count(fwd["flops"])
    qn, kn, vn, dtype = q.node, k.node, v.node, q.dtype

    def backward(g):
        G = xp.ascontiguousarray(g, dtype=xp.float32)
        dq, dk, dv = kernels.backward(impl, G, Q, K, V, state, deterministic=False)
        tape.count(bwd["flops"] - bwd["recompute_flops"])
        if bwd["recompute_flops"]:
            tape.count(bwd["recompute_flops"], "recompute")
        for n, grad in ((qn, dq), (kn, dk), (vn, dv)):
            if n is not None:
                n.add_grad(grad.astype(dtype, copy=False))

    tensors = getattr(state, "tensors", None)  # count each saved array by its own buffer
    held = list(tensors.values()) if isinstance(tensors, dict) else [state]
    return make(O.astype(dtype, copy=False), "attention", (q, k, v), backward,
                saved=(Q, K, V, *held))
