"""Differentiable ops beyond Tensor's own operators: linear layers, head splitting, pointwise
functions. Each computes its output array and a closure `backward(g)` that accumulates into its
inputs' gradients, under the rules stated in ckptlab.engine.tensor.

The arithmetic and shape ops (add ... transpose) live in ckptlab.engine.tensor, behind Tensor's
operators; they are importable from here too, so `ops.matmul(a, b)` reads like the rest.

Ops whose backward needs only their inputs or output go through `tape.compute()`, so a
selective checkpoint may store their outputs instead of recomputing them (REPLAYABLE).
"""

from __future__ import annotations

import math

from ckptlab.engine import tape
from ckptlab.engine.arrays import normalize_axes, xp_of
from ckptlab.engine.tensor import (  # noqa: F401  (the arithmetic, importable from here too)
    Tensor,
    add,
    div,
    make,
    matmul,
    mean,
    mul,
    neg,
    reshape,
    sub,
    sum,
    transpose,
)

REPLAYABLE = frozenset({"add", "sub", "mul", "div", "matmul", "linear", "relu", "gelu", "tanh",
                        "exp", "log", "softmax", "embedding"})


def linear(x: Tensor, W: Tensor, b: Tensor | None = None) -> Tensor:
    """y = x @ W + b with W of shape (in, out): dx = g W^T, dW = x^T g, db = sum(g)."""
    if W.ndim != 2 or x.ndim < 1 or x.shape[-1] != W.shape[0]:
        raise ValueError(f"linear: x {x.shape} does not fit W {W.shape} (expected x of shape "
                         f"(..., in) and W (in, out))")
    if b is not None and b.shape != (W.shape[1],):
        raise ValueError(f"linear: bias of shape {b.shape} for W {W.shape}; expected "
                         f"({W.shape[1]},)")
    k, n = W.shape
    M = x.size // k
    flops = 2 * M * k * n + (M * n if b is not None else 0)
    xn, Wn, bn, sx = x.node, W.node, (b.node if b is not None else None), x.shape
    X, Wd = (x.data if Wn else None), (W.data if xn else None)

    def forward():
        y = x.data @ W.data  # (..., out)
        if b is not None:
            y += b.data
        return y

    y = tape.compute("linear", forward, flops)

    def backward(g):
        g2 = g.reshape(-1, n)  # (M, out)
        if xn is not None:
            xn.add_grad((g2 @ Wd.T).reshape(sx))
            tape.count(2 * M * k * n)
        if Wn is not None:
            Wn.add_grad(X.reshape(-1, k).T @ g2)
            tape.count(2 * M * k * n)
        if bn is not None:
            bn.add_grad(g2.sum(axis=0))
            tape.count(M * n)

    inputs = (x, W) if b is None else (x, W, b)
    return make(y, "linear", inputs, backward, saved=(x if Wn else None, W if xn else None))


def split_heads(x: Tensor, heads: int) -> Tensor:
    """(B, N, C) -> (B, H, N, C/H)."""
    if x.ndim != 3 or x.shape[2] % heads:
        raise ValueError(f"split_heads: expected (B, N, C) with C divisible by heads={heads}, "
                         f"got {x.shape}")
    B, N, C = x.shape
    return transpose(reshape(x, B, N, heads, C // heads), 0, 2, 1, 3)  # (B, H, N, d)


def merge_heads(x: Tensor) -> Tensor:
    """(B, H, N, d) -> (B, N, H*d)."""
    if x.ndim != 4:
        raise ValueError(f"merge_heads: expected (B, H, N, d), got {x.shape}")
    B, H, N, d = x.shape
    return reshape(transpose(x, 0, 2, 1, 3), B, N, H * d)  # (B, N, C)


# ------------------------------------------------------------------------------ pointwise


def relu(x: Tensor) -> Tensor:
    """y = max(x, 0); dx = g * [y > 0]."""
    xn = x.node
    xp = xp_of(x.data)
    y = tape.compute("relu", lambda: xp.maximum(x.data, 0), x.size)

    def backward(g):
        xn.add_grad(g * (y > 0))
        tape.count(2 * g.size)

    return make(y, "relu", (x,), backward, saved=(y,))


_GELU_C = math.sqrt(2.0 / math.pi)


def _gelu_t(X, xp):
    """t = tanh(c (x + 0.044715 x^3)); x^3 as x*x*x: NumPy's power() is ~25x slower."""
    return xp.tanh(_GELU_C * (X + 0.044715 * X * X * X))


def gelu(x: Tensor) -> Tensor:
    """GELU, tanh form: y = x/2 (1 + tanh(u)), u = c (x + 0.044715 x^3), c = sqrt(2/pi).
    dy/dx = (1 + t)/2 + x/2 (1 - t^2) c (1 + 3 * 0.044715 x^2). Saves x only (t is recomputed)."""
    xn, X = x.node, x.data
    xp = xp_of(X)
    y = tape.compute("gelu", lambda: 0.5 * X * (1.0 + _gelu_t(X, xp)), 8 * x.size)

    def backward(g):
        t = _gelu_t(X, xp)
        dydx = 0.5 * (1.0 + t) + 0.5 * X * (1.0 - t * t) * _GELU_C * (1.0 + 3 * 0.044715 * X * X)
        xn.add_grad(g * dydx)
        tape.count(18 * g.size)

    return make(y, "gelu", (x,), backward, saved=(x,))


def tanh(x: Tensor) -> Tensor:
    """y = tanh(x); dx = g (1 - y^2)."""
    xn, xp = x.node, xp_of(x.data)
    y = tape.compute("tanh", lambda: xp.tanh(x.data), x.size)

    def backward(g):
        xn.add_grad(g * (1.0 - y * y))
        tape.count(3 * g.size)

    return make(y, "tanh", (x,), backward, saved=(y,))


def exp(x: Tensor) -> Tensor:
    """y = e^x; dx = g y."""
    xn, xp = x.node, xp_of(x.data)
    y = tape.compute("exp", lambda: xp.exp(x.data), x.size)

    def backward(g):
        xn.add_grad(g * y)
        tape.count(g.size)

    return make(y, "exp", (x,), backward, saved=(y,))


def log(x: Tensor) -> Tensor:
    """y = ln x; dx = g / x."""
    xn, X, xp = x.node, x.data, xp_of(x.data)
    y = tape.compute("log", lambda: xp.log(X), x.size)

    def backward(g):
        xn.add_grad(g / X)
        tape.count(g.size)

    return make(y, "log", (x,), backward, saved=(x,))


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """y = exp(x - max) / sum(exp(x - max)); dx = y (g - sum(g y))."""
    xn, xp = x.node, xp_of(x.data)
    normalize_axes(axis, x.ndim)

    def forward():
        e = xp.exp(x.data - x.data.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)

    y = tape.compute("softmax", forward, 4 * x.size)

    def backward(g):
        xn.add_grad(y * (g - (g * y).sum(axis=axis, keepdims=True)))
        tape.count(4 * g.size)

    return make(y, "softmax", (x,), backward, saved=(y,))
