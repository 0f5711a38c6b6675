"""The autograd engine, in micrograd's shape, on NumPy or CuPy arrays.

    tape.py       Node, backward, the engine's state (grad mode, phase, RNG, ledger hook)
    tensor.py     Tensor and the ops behind its operators (+ - * / @, sum, reshape, ...)
    arrays.py     below Tensor: xp_of, and the shapes gradients take back through
                  broadcasting and reductions
    ops.py        linear, pointwise functions, head splitting
    layers.py     layernorm, dropout, cross-entropy, embedding, attention
    gradcheck.py  gradients against central differences

    from ckptlab.engine import Tensor, ops, layers
    x = Tensor(np.ones((2, 3)), requires_grad=True)
    ops.relu(x @ W).sum().backward()
"""

from ckptlab.engine import layers, ops, tape
from ckptlab.engine.gradcheck import gradcheck
from ckptlab.engine.tape import (
    enable_grad,
    is_grad_enabled,
    manual_seed,
    no_grad,
    rng_state,
    set_rng_state,
)
from ckptlab.engine.tensor import Tensor

__all__ = ["Tensor", "enable_grad", "gradcheck", "is_grad_enabled", "layers", "manual_seed",
           "no_grad", "ops", "rng_state", "set_rng_state", "tape"]
