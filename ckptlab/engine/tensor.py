"""Tensor: an array with an optional gradient, and the ops its operators and methods run.

Every op computes its output array and a closure `backward(g)` that, given g = dLoss/dOutput,
accumulates (+=) into its inputs' gradients; `make()` records the closure on the tape
(ckptlab.engine.tape) and hands the saved arrays to the ledger. Here: the arithmetic behind
+ - * / @ (broadcasting) and the reductions and reshapes behind .sum() .mean() .reshape()
.transpose(). The shapes their gradients take on the way back (summed over what broadcasting
added, spread over what a reduction removed) are in ckptlab.engine.arrays; the rest of the ops
in ckptlab.engine.ops (pointwise, linear) and ckptlab.engine.layers (layernorm, dropout,
attention, ...).

Rules every op keeps, because the ledger and the checkpoint tests depend on them:
- a closure captures Nodes, shapes and the arrays listed in `saved=`; never an input Tensor
  (that would keep an activation alive that the ledger does not count);
- an input that does not require grad gets no gradient computed;
- FLOPs: 2mnk per matmul; one per element per arithmetic step of a pointwise op; backward
  counts its own.
"""

from __future__ import annotations

import math

import numpy as np

from ckptlab import device
from ckptlab.engine import tape
from ckptlab.engine.arrays import broadcast_shape, normalize_axes, spread, unbroadcast, xp_of

# ------------------------------------------------------------------------------ making ops


def make(data, name: str, inputs, backward, saved=(), force: bool = False,
         kind: str = "saved") -> Tensor:
    """Wrap an op's output array. If grad is on and an input needs a gradient (or `force`), a
    Node records the closure `backward(g)` and the ledger acquires `saved` (arrays, Tensors,
    or objects with .nbytes; parameters and None are skipped) as `kind`."""
    led, trace = tape._state.ledger, tape._state.trace
    if led is not None:
        led.on_op(data)
    if trace is not None:
        trace.record(name, data, inputs)
    out = Tensor._wrap(data)
    if not tape._state.grad_enabled:
        return out
    prev = tuple(t.node for t in inputs if t.node is not None)
    if not prev and not force:
        return out
    node = tape.Node(name, prev, backward, data.shape)
    if led is not None:
        arrays = []
        for s in saved:
            if isinstance(s, Tensor):
                if s.node is None or not s.node.param:
                    arrays.append(s.data)
            elif s is not None:
                arrays.append(s)
        node.saved = led.acquire(arrays, tape._state.phase, kind)
    out.node = node
    return out


# ------------------------------------------------------------------------------ helpers


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


# ------------------------------------------------------------------------------ arithmetic


def add(a, b) -> Tensor:
    """y = a + b (broadcasting); da = g, db = g, summed back to each shape."""
    a, b = _pair(a, b)
    shape = broadcast_shape("add", a, b)
    an, bn, sa, sb = a.node, b.node, a.shape, b.shape
    y = tape.compute("add", lambda: a.data + b.data, math.prod(shape))

    def backward(g):
        if an is not None:
            an.add_grad(unbroadcast(g, sa))
        if bn is not None:
            bn.add_grad(unbroadcast(g, sb))

    return make(y, "add", (a, b), backward)


def sub(a, b) -> Tensor:
    """y = a - b; da = g, db = -g."""
    a, b = _pair(a, b)
    shape = broadcast_shape("sub", a, b)
    an, bn, sa, sb = a.node, b.node, a.shape, b.shape
    y = tape.compute("sub", lambda: a.data - b.data, math.prod(shape))

    def backward(g):
        if an is not None:
            an.add_grad(unbroadcast(g, sa))
        if bn is not None:
            bn.add_grad(unbroadcast(-g, sb))
            tape.count(g.size)

    return make(y, "sub", (a, b), backward)


def mul(a, b) -> Tensor:
    """y = a * b; da = g * b, db = g * a (each saved only if the other needs a gradient)."""
    a, b = _pair(a, b)
    shape = broadcast_shape("mul", a, b)
    an, bn, sa, sb = a.node, b.node, a.shape, b.shape
    A, B = (a.data if bn else None), (b.data if an else None)
    y = tape.compute("mul", lambda: a.data * b.data, math.prod(shape))

    def backward(g):
        if an is not None:
            an.add_grad(unbroadcast(g * B, sa))
            tape.count(g.size)
        if bn is not None:
            bn.add_grad(unbroadcast(g * A, sb))
            tape.count(g.size)

    return make(y, "mul", (a, b), backward, saved=(a if bn else None, b if an else None))


def div(a, b) -> Tensor:
    """y = a / b; da = g / b, db = -g * y / b."""
    a, b = _pair(a, b)
    shape = broadcast_shape("div", a, b)
    an, bn, sa, sb = a.node, b.node, a.shape, b.shape
    B = b.data
    y = tape.compute("div", lambda: a.data / b.data, math.prod(shape))
    Y = y if bn else None

    def backward(g):
        if an is not None:
            an.add_grad(unbroadcast(g / B, sa))
            tape.count(g.size)
        if bn is not None:
            bn.add_grad(unbroadcast(-(g * Y) / B, sb))
            tape.count(3 * g.size)

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
    y = tape.compute("matmul", lambda: a.data @ b.data, flops)

    def backward(g):
        if an is not None:
            an.add_grad(unbroadcast(g @ B.swapaxes(-1, -2), sa))
            tape.count(flops)
        if bn is not None:
            if len(sb) == 2:  # one weight for every batch element: one big matmul
                gb = A.reshape(-1, k).T @ g.reshape(-1, n)  # (k, n)
            else:
                gb = unbroadcast(A.swapaxes(-1, -2) @ g, sb)
            bn.add_grad(gb)
            tape.count(flops)

    return make(y, "matmul", (a, b), backward, saved=(a if bn else None, b if an else None))


# ------------------------------------------------------------------------------ reductions, shapes


def sum(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    """y = sum over `axis`; dx = g broadcast back."""
    axes, shape, xn = normalize_axes(axis, x.ndim), x.shape, x.node
    y = xp_of(x.data).asarray(x.data.sum(axis=axes, keepdims=keepdims))  # 0-d, not a scalar
    tape.count(x.size)

    def backward(g):
        xn.add_grad(spread(g, shape, axes, keepdims))

    return make(y, "sum", (x,), backward)


def mean(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    """y = sum / n over `axis`; dx = g / n broadcast back."""
    axes, shape, xn = normalize_axes(axis, x.ndim), x.shape, x.node
    n = math.prod(shape[a] for a in axes)
    y = xp_of(x.data).asarray(x.data.mean(axis=axes, keepdims=keepdims))
    tape.count(x.size)

    def backward(g):
        xn.add_grad(spread(g / n, shape, axes, keepdims))
        tape.count(g.size)

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


# ------------------------------------------------------------------------------ the Tensor


class Tensor:
    """An array with an optional gradient. `requires_grad=True` makes a leaf that accumulates
    one; `param=False` marks such a leaf as an activation (counted by the ledger) rather than a
    parameter (never counted)."""

    __slots__ = ("data", "node", "__weakref__")
    __array_priority__ = 100  # numpy_array + Tensor calls Tensor.__radd__

    def __init__(self, data, requires_grad: bool = False, param: bool = True):
        if isinstance(data, Tensor):
            raise TypeError("data: expected an array, got a Tensor (use .detach() or .data)")
        if not isinstance(data, np.ndarray) and not hasattr(data, "__array_namespace__"):
            data = device.xp().asarray(data)  # lists, scalars: onto the current target
        elif isinstance(data, np.ndarray) and device.target() == "cuda":
            data = device.xp("cuda").asarray(data)
        self.data, self.node = data, None
        if requires_grad:
            self._make_leaf(param)

    def _make_leaf(self, param: bool) -> None:
        if self.data.dtype.kind != "f":
            raise TypeError(f"requires_grad needs a floating dtype, got {self.data.dtype}")
        self.node = tape.Node("leaf", shape=self.data.shape, leaf=True, param=param)

    @classmethod
    def _wrap(cls, data):
        t = cls.__new__(cls)
        t.data, t.node = data, None
        return t

    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
    ndim = property(lambda self: self.data.ndim)
    size = property(lambda self: self.data.size)
    requires_grad = property(lambda self: self.node is not None)

    @property
    def grad(self):
        return None if self.node is None else self.node.grad

    @grad.setter
    def grad(self, value):
        if self.node is None:
            raise ValueError("this Tensor does not require grad; it has no .grad to set")
        self.node.grad = value

    def retain_grad(self) -> Tensor:
        """Keep this non-leaf's gradient after backward (freed by default, to save memory)."""
        if self.node is not None:
            self.node.retain = True
        return self

    def detach(self, requires_grad: bool = False) -> Tensor:
        """Same array, no history (an activation leaf, not a parameter, if requires_grad)."""
        t = Tensor._wrap(self.data)
        if requires_grad:
            t._make_leaf(param=False)
        return t

    def numpy(self):
        return device.to_numpy(self.data)

    def item(self) -> float:
        if self.size != 1:
            raise ValueError(f"item(): expected a single element, got shape {self.shape}")
        return float(device.to_numpy(self.data).reshape(-1)[0])

    def backward(self, grad=None) -> None:
        """Backpropagate from this tensor; `grad` defaults to 1 for a single-element tensor."""
        if self.node is None:
            raise RuntimeError("backward(): this tensor does not require grad (no graph to walk)")
        if grad is None:
            if self.size != 1:
                raise ValueError(f"backward(): grad must be given for a non-scalar of shape "
                                 f"{self.shape}")
            grad = xp_of(self.data).ones_like(self.data)
        grad = grad.data if isinstance(grad, Tensor) else grad
        if grad.shape != self.shape:
            raise ValueError(f"backward(): grad of shape {grad.shape} for a tensor of shape "
                             f"{self.shape}")
        tape.backward(self.node, grad)


    # operators and methods: the ops defined above, in this module (micrograd's Value does
    # the same); + and * commute exactly in floating point, so their reflected forms share them
    __add__ = __radd__ = add
    __mul__ = __rmul__ = mul
    __sub__, __truediv__, __matmul__, __neg__ = sub, div, matmul, neg
    sum, mean, reshape, transpose = sum, mean, reshape, transpose

    def __rsub__(self, other):
        return sub(other, self)

    def __rtruediv__(self, other):
        return div(other, self)

    def __rmatmul__(self, other):
        return matmul(other, self)

    def __repr__(self):
        return f"Tensor(shape={self.shape}, dtype={self.dtype}, requires_grad={self.requires_grad})"
