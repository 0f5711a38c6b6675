"""Differentiable ops: each computes its output array and a closure `backward(g)` that
accumulates into its inputs' gradients (g = dLoss/dOutput, same shape as the output).

Rules every op keeps, because the ledger and the checkpoint tests depend on them:
- a closure captures Nodes, shapes and the arrays listed in `saved=`; never an input Tensor
  (that would keep an activation alive that the ledger does not count);
- an input that does not require grad gets no gradient computed;
- FLOPs: 2mnk per matmul; one per element per arithmetic step of a pointwise op (constants
  stated where they are counted); backward counts its own.

Ops whose backward needs only their inputs or output go through `compute()`, so a selective
checkpoint may store their outputs instead of recomputing them (REPLAYABLE).
Layer ops (layernorm, dropout, cross-entropy, embedding, attention) live in ckptlab.ops_nn and
are re-exported here, so `ops.attention` etc. work.
"""

from __future__ import annotations

import math

import numpy as np

from ckptlab.autograd import Tensor, compute, count, make, xp_of

REPLAYABLE = frozenset({"add", "sub", "mul", "div", "matmul", "linear", "relu", "gelu", "tanh",
                        "exp", "log", "softmax", "embedding"})


def _as_tensor(x, like: Tensor) -> Tensor:
    """Python numbers and arrays become constants of `like`'s dtype and array module."""
    if isinstance(x, Tensor):
        return x
    return Tensor._wrap(xp_of(like.data).asarray(x, dtype=like.dtype))


def _pair(a, b):
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise TypeError(f"expected at least one Tensor, got {type(a).__name__} and "
                        f"{type(b).__name__}")
    return (_as_tensor(a, b), b) if not isinstance(a, Tensor) else (a, _as_tensor(b, a))


def _broadcast(op: str, a: Tensor, b: Tensor) -> tuple:
    try:
        return np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ValueError(f"{op}: shapes {a.shape} and {b.shape} do not broadcast") from None


def _unbroadcast(g, shape):
    """Sum g over the axes broadcasting added or stretched, back to `shape`."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


# ------------------------------------------------------------------------------ arithmetic


def add(a, b) -> Tensor:
    """y = a + b (broadcasting); da = g, db = g, summed back to each shape."""
    a, b = _pair(a, b)
    shape = _broadcast("add", a, b)
    an, bn, sa, sb = a.node, b.node, a.shape, b.shape
    y = compute("add", lambda: a.data + b.data, math.prod(shape))

    def backward(g):
        if an is not None:
            an.add_grad(_unbroadcast(g, sa))
        if bn is not None:
            bn.add_grad(_unbroadcast(g, sb))

    return make(y, "add", (a, b), backward)


def sub(a, b) -> Tensor:
    """y = a - b; da = g, db = -g."""
    a, b = _pair(a, b)
    shape = _broadcast("sub", a, b)
    an, bn, sa, sb = a.node, b.node, a.shape, b.shape
    y = compute("sub", lambda: a.data - b.data, math.prod(shape))

    def backward(g):
        if an is not None:
            an.add_grad(_unbroadcast(g, sa))
        if bn is not None:
            bn.add_grad(_unbroadcast(-g, sb))
            count(g.size)

    return make(y, "sub", (a, b), backward)


def mul(a, b) -> Tensor:
    """y = a * b; da = g * b, db = g * a (each saved only if the other needs a gradient)."""
    a, b = _pair(a, b)
    shape = _broadcast("mul", a, b)
    an, bn, sa, sb = a.node, b.node, a.shape, b.shape
    A, B = (a.data if bn else None), (b.data if an else None)
    y = compute("mul", lambda: a.data * b.data, math.prod(shape))

    def backward(g):
        if an is not None:
            an.add_grad(_unbroadcast(g * B, sa))
            count(g.size)
        if bn is not None:
            bn.add_grad(_unbroadcast(g * A, sb))
            count(g.size)

    return make(y, "mul", (a, b), backward, saved=(a if bn else None, b if an else None))


def div(a, b) -> Tensor:
    """y = a / b; da = g / b, db = -g * y / b."""
    a, b = _pair(a, b)
    shape = _broadcast("div", a, b)
    an, bn, sa, sb = a.node, b.node, a.shape, b.shape
    B = b.data
    y = compute("div", lambda: a.data / b.data, math.prod(shape))
    Y = y if bn else None

    def backward(g):
        if an is not None:
            an.add_grad(_unbroadcast(g / B, sa))
            count(g.size)
        if bn is not None:
            bn.add_grad(_unbroadcast(-(g * Y) / B, sb))
            count(3 * g.size)

    return make(y, "div", (a, b), backward, saved=(b, Y))


def neg(a: Tensor) -> Tensor:
    return mul(a, -1.0)


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """y = a @ b on (..., m, k) @ (..., k, n); da = g b^T, db = a^T g. 2mnk FLOPs each."""
    a, b = _pair(a, b)
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"matmul: expected arrays of >= 2 dims, got a {a.shape} and b {b.shape}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul: inner dimensions differ: a {a.shape} @ b {b.shape}")
    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ValueError(f"matmul: batch dims of a {a.shape} and b {b.shape} do not "
                         "broadcast") from None
    (m, k), n = a.shape[-2:], b.shape[-1]
    flops = 2 * math.prod(batch) * m * k * n
    an, bn, sa, sb = a.node, b.node, a.shape, b.shape
    A, B = (a.data if bn else None), (b.data if an else None)
    y = compute("matmul", lambda: a.data @ b.data, flops)

    def backward(g):
        if an is not None:
            an.add_grad(_unbroadcast(g @ B.swapaxes(-1, -2), sa))
            count(flops)
        if bn is not None:
            if len(sb) == 2:  # one weight for every batch element: one big matmul
                gb = A.reshape(-1, k).T @ g.reshape(-1, n)  # (k, n)
            else:
                gb = _unbroadcast(A.swapaxes(-1, -2) @ g, sb)
            bn.add_grad(gb)
            count(flops)

    return make(y, "matmul", (a, b), backward, saved=(a if bn else None, b if an else None))


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

    y = compute("linear", forward, flops)

    def backward(g):
        g2 = g.reshape(-1, n)  # (M, out)
        if xn is not None:
            xn.add_grad((g2 @ Wd.T).reshape(sx))
            count(2 * M * k * n)
        if Wn is not None:
            Wn.add_grad(X.reshape(-1, k).T @ g2)
            count(2 * M * k * n)
        if bn is not None:
            bn.add_grad(g2.sum(axis=0))
            count(M * n)

    inputs = (x, W) if b is None else (x, W, b)
    return make(y, "linear", inputs, backward, saved=(x if Wn else None, W if xn else None))


# ------------------------------------------------------------------------------ reductions, shapes


def _axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    axis = (axis,) if isinstance(axis, int) else tuple(axis)
    for a in axis:
        if not -ndim <= a < ndim:
            raise ValueError(f"axis {a} is out of range for a tensor of {ndim} dims")
    return tuple(sorted(a % ndim for a in axis))


def _spread(g, shape, axes, keepdims):
    """Broadcast a reduced gradient back to `shape` (a fresh array, not a read-only view)."""
    xp = xp_of(g)
    if not keepdims:
        g = xp.expand_dims(g, axes)
    return xp.broadcast_to(g, shape).copy()


def sum(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    """y = sum over `axis`; dx = g broadcast back."""
    axes, shape, xn = _axes(axis, x.ndim), x.shape, x.node
    y = xp_of(x.data).asarray(x.data.sum(axis=axes, keepdims=keepdims))  # 0-d, not a scalar
    count(x.size)

    def backward(g):
        xn.add_grad(_spread(g, shape, axes, keepdims))

    return make(y, "sum", (x,), backward)


def mean(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    """y = sum / n over `axis`; dx = g / n broadcast back."""
    axes, shape, xn = _axes(axis, x.ndim), x.shape, x.node
    n = math.prod(shape[a] for a in axes)
    y = xp_of(x.data).asarray(x.data.mean(axis=axes, keepdims=keepdims))
    count(x.size)

    def backward(g):
        xn.add_grad(_spread(g / n, shape, axes, keepdims))
        count(g.size)

    return make(y, "mean", (x,), backward)


def reshape(x: Tensor, *shape) -> Tensor:
    shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    try:
        y = x.data.reshape(shape)
    except ValueError:
        raise ValueError(f"reshape: cannot reshape {x.shape} into {shape}") from None
    xn, sx = x.node, x.shape

    def backward(g):
        xn.add_grad(g.reshape(sx))

    return make(y, "reshape", (x,), backward)


def transpose(x: Tensor, *axes) -> Tensor:
    """Permute axes (default: reverse them); the gradient is permuted back."""
    axes = tuple(axes[0]) if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
    axes = axes or tuple(reversed(range(x.ndim)))
    if sorted(a % x.ndim for a in axes) != list(range(x.ndim)) or len(axes) != x.ndim:
        raise ValueError(f"transpose: axes {axes} are not a permutation for shape {x.shape}")
    inverse = tuple(np.argsort([a % x.ndim for a in axes]))
    xn = x.node
    y = x.data.transpose(axes)

    def backward(g):
        xn.add_grad(g.transpose(inverse))

    return make(y, "transpose", (x,), backward)


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
    y = compute("relu", lambda: xp.maximum(x.data, 0), x.size)

    def backward(g):
        xn.add_grad(g * (y > 0))
        count(2 * g.size)

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
    y = compute("gelu", lambda: 0.5 * X * (1.0 + _gelu_t(X, xp)), 8 * x.size)

    def backward(g):
        t = _gelu_t(X, xp)
        dydx = 0.5 * (1.0 + t) + 0.5 * X * (1.0 - t * t) * _GELU_C * (1.0 + 3 * 0.044715 * X * X)
        xn.add_grad(g * dydx)
        count(18 * g.size)

    return make(y, "gelu", (x,), backward, saved=(x,))


def tanh(x: Tensor) -> Tensor:
    """y = tanh(x); dx = g (1 - y^2)."""
    xn, xp = x.node, xp_of(x.data)
    y = compute("tanh", lambda: xp.tanh(x.data), x.size)

    def backward(g):
        xn.add_grad(g * (1.0 - y * y))
        count(3 * g.size)

    return make(y, "tanh", (x,), backward, saved=(y,))


def exp(x: Tensor) -> Tensor:
    """y = e^x; dx = g y."""
    xn, xp = x.node, xp_of(x.data)
    y = compute("exp", lambda: xp.exp(x.data), x.size)

    def backward(g):
        xn.add_grad(g * y)
        count(g.size)

    return make(y, "exp", (x,), backward, saved=(y,))


def log(x: Tensor) -> Tensor:
    """y = ln x; dx = g / x."""
    xn, X, xp = x.node, x.data, xp_of(x.data)
    y = compute("log", lambda: xp.log(X), x.size)

    def backward(g):
        xn.add_grad(g / X)
        count(g.size)

    return make(y, "log", (x,), backward, saved=(x,))


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """y = exp(x - max) / sum(exp(x - max)); dx = y (g - sum(g y))."""
    xn, xp = x.node, xp_of(x.data)
    _axes(axis, x.ndim)

    def forward():
        e = xp.exp(x.data - x.data.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)

    y = compute("softmax", forward, 4 * x.size)

    def backward(g):
        xn.add_grad(y * (g - (g * y).sum(axis=axis, keepdims=True)))
        count(4 * g.size)

    return make(y, "softmax", (x,), backward, saved=(y,))


# ------------------------------------------------------------------------------ Tensor methods

from ckptlab.ops_nn import (  # noqa: E402,F401  (layer ops, re-exported)
    attention,
    cross_entropy,
    dropout,
    embedding,
    keep_mask,
    layernorm,
)

Tensor.__add__ = lambda a, b: add(a, b)
Tensor.__radd__ = lambda a, b: add(b, a)
Tensor.__sub__ = lambda a, b: sub(a, b)
Tensor.__rsub__ = lambda a, b: sub(b, a)
Tensor.__mul__ = lambda a, b: mul(a, b)
Tensor.__rmul__ = lambda a, b: mul(b, a)
Tensor.__truediv__ = lambda a, b: div(a, b)
Tensor.__rtruediv__ = lambda a, b: div(b, a)
Tensor.__neg__ = neg
Tensor.__matmul__ = lambda a, b: matmul(a, b)
Tensor.__rmatmul__ = lambda a, b: matmul(b, a)
Tensor.sum = sum
Tensor.mean = mean
Tensor.reshape = reshape
Tensor.transpose = transpose
Tensor.relu = relu
Tensor.tanh = tanh
Tensor.exp = exp
Tensor.log = log
Tensor.softmax = softmax
