"""Check an op's (or any function's) gradients against central differences, in float64."""

from __future__ import annotations

import numpy as np

from ckptlab import device
from ckptlab.engine import tape
from ckptlab.engine.arrays import xp_of
from ckptlab.engine.tensor import Tensor


def gradcheck(fn, inputs, eps: float = 1e-6, atol: float = 1e-7, rtol: float = 1e-5) -> bool:
    """Check fn's gradients against central differences, in float64.

    L = sum(fn(*inputs) * R) for a fixed random R; analytic dL/dx from backward(), numeric
    (L(x + eps) - L(x - eps)) / 2eps element by element for every input that requires grad.
    Central differences err by O(eps^2 f''') + O(1e-16 / eps) ~ 1e-10 at eps=1e-6, hence the
    default tolerances. The RNG state is reset before every call so dropout masks repeat.
    Raises AssertionError naming the input, element and both values; returns True."""
    inputs = list(inputs)
    for k, t in enumerate(inputs):
        if not isinstance(t, Tensor):
            raise TypeError(f"inputs[{k}]: expected a Tensor, got {type(t).__name__}")
        if t.requires_grad and t.dtype != np.float64:
            raise TypeError(f"inputs[{k}]: gradcheck needs float64, got {t.dtype}")
    state = tape.rng_state()
    tape.set_rng_state(state)
    out = fn(*inputs)
    xp = xp_of(out.data)
    R = xp.asarray(np.random.default_rng(1234).standard_normal(out.shape))  # (out.shape)

    def loss_value():
        tape.set_rng_state(state)
        with tape.no_grad():
            return float((fn(*inputs).data * R).sum())

    for t in inputs:
        if t.requires_grad:
            t.grad = None
    out.backward(R)
    try:
        for k, t in enumerate(inputs):
            if not t.requires_grad:
                continue
            analytic = device.to_numpy(t.grad if t.grad is not None else xp.zeros_like(t.data))
            flat = t.data.reshape(-1)  # a view: writes go to t.data
            for i in range(flat.size):
                orig = float(flat[i])
                flat[i] = orig + eps
                plus = loss_value()
                flat[i] = orig - eps
                minus = loss_value()
                flat[i] = orig
                numeric = (plus - minus) / (2 * eps)
                a = float(analytic.reshape(-1)[i])
                if not abs(a - numeric) <= atol + rtol * abs(numeric):
                    idx = np.unravel_index(i, t.shape)
                    raise AssertionError(f"gradcheck: input {k} (shape {t.shape}) element {idx}: "
                                         f"analytic {a!r} vs numeric {numeric!r}")
    finally:
        tape.set_rng_state(state)
    return True
