"""The array side of the engine's ops, below Tensor (no Tensor here): which array module an
array belongs to, and the shapes gradients take on their way back.

    xp_of            numpy or cupy, read off the array (asking the device costs ~0.2 ms)
    broadcast_shape  the output shape of an op on two broadcasting operands
    unbroadcast      a gradient summed over what broadcasting added or stretched: the adjoint
                     of broadcasting, back to the input's shape
    normalize_axes   a reduction's `axis` argument as a sorted tuple of axes
    spread           a reduced gradient broadcast back over the reduced axes: the adjoint of a
                     reduction

ckptlab.engine.tensor's ops use them (+ - * / @ broadcast, sum and mean reduce); the other ops,
the layers and the models take xp_of and normalize_axes from here too.
"""

from __future__ import annotations

import numpy as np

from ckptlab import device


def xp_of(a):
    """The array module of `a` (numpy or cupy) without asking the device (that costs ~0.2 ms)."""
    return np if isinstance(a, (np.ndarray, np.generic)) else device.xp("cuda")


# ------------------------------------------------------------------------------ broadcasting


def broadcast_shape(op: str, a, b) -> tuple:
    """The shape of `op`'s output on operands a and b (anything with .shape: Tensors, arrays);
    a ValueError naming op and both shapes when they do not broadcast."""
    try:
        return np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ValueError(f"{op}: shapes {a.shape} and {b.shape} do not broadcast") from None


def unbroadcast(g, shape):
    """Sum g over the axes broadcasting added or stretched, back to `shape`."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


# ------------------------------------------------------------------------------ reductions


def normalize_axes(axis, ndim) -> tuple:
    """`axis` (None, an int or ints, negative allowed) as a sorted tuple of axes of `ndim`."""
    if axis is None:
        return tuple(range(ndim))
    axis = (axis,) if isinstance(axis, int) else tuple(axis)
    for a in axis:
        if not -ndim <= a < ndim:
            raise ValueError(f"axis {a} is out of range for a tensor of {ndim} dims")
    return tuple(sorted(a % ndim for a in axis))


def spread(g, shape, axes, keepdims):
    """Broadcast a reduced gradient back to `shape` (a fresh array, not a read-only view)."""
    xp = xp_of(g)
    if not keepdims:
        g = xp.expand_dims(g, axes)
    return xp.broadcast_to(g, shape).copy()
