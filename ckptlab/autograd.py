"""A small reverse-mode autograd engine, in micrograd's shape, on NumPy or CuPy arrays.

Every op (ckptlab.ops) computes its output array and a closure `backward(g)` that, given
g = dLoss/dOutput, accumulates (+=) into the gradients of its inputs. `backward()` sorts the
graph topologically and runs the closures from the loss down.

One departure from micrograd, and it is the point of this lab: the graph is made of `Node`s,
not of Tensors. A Node holds its inputs' Nodes, its closure and the arrays that closure saved;
never an input's array unless the op saved it. So the graph keeps alive exactly what the ledger
(ckptlab.ledger) counts, and an activation nobody saved is freed as soon as the Python code
drops it. Once a node's backward has run, its closure and saved arrays are released.

Engine state (one per process): grad mode (`no_grad()`), the phase ("forward", "recompute",
"backward") FLOPs are counted under, the dropout RNG state (seed, offset), the ledger, and the
selective-checkpoint context (ckptlab.checkpoint).
"""

from __future__ import annotations

import contextlib

import numpy as np

from ckptlab import device


class _State:
    grad_enabled = True
    phase = "forward"
    seed = 0
    offset = 0  # advanced by one for each dropout call: a counter-based RNG needs no more
    ledger = None
    selective = None  # checkpoint._Selective while a selective checkpoint stores or replays


_state = _State()


class Node:
    """One vertex of the graph: an op's output (or a leaf that wants a gradient)."""

    __slots__ = ("name", "prev", "backward", "grad", "saved", "shape", "leaf", "param", "retain")

    def __init__(self, name, prev=(), backward=None, shape=(), leaf=False, param=False):
        self.name, self.prev, self.backward, self.shape = name, prev, backward, shape
        self.leaf, self.param, self.retain = leaf, param, leaf
        self.grad = None
        self.saved = None  # ledger keys of what the closure holds

    def add_grad(self, g) -> None:
        """grad += g, out of place: the engine never writes a gradient array after handing it
        over, so one array may serve as two inputs' gradients (add passes g to both). Treat
        .grad as read-only: replace it, do not modify it in place."""
        if g.shape != self.shape:
            raise ValueError(f"{self.name}: gradient of shape {g.shape} for a value of shape "
                             f"{self.shape}")
        self.grad = g if self.grad is None else self.grad + g

    def __repr__(self):
        return f"Node({self.name}, shape={self.shape})"


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
        self.node = Node("leaf", shape=self.data.shape, leaf=True, param=param)

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
        backward(self.node, grad)

    def __repr__(self):
        return f"Tensor(shape={self.shape}, dtype={self.dtype}, requires_grad={self.requires_grad})"


def xp_of(a):
    """The array module of `a` (numpy or cupy) without asking the device (that costs ~0.2 ms)."""
    return np if isinstance(a, (np.ndarray, np.generic)) else device.xp("cuda")


# ------------------------------------------------------------------------------ making ops


def make(data, name: str, inputs, backward, saved=(), force: bool = False,
         kind: str = "saved") -> Tensor:
    """Wrap an op's output array. If grad is on and an input needs a gradient (or `force`), a
    Node records the closure `backward(g)` and the ledger acquires `saved` (arrays, Tensors,
    or objects with .nbytes; parameters and None are skipped) as `kind`."""
    led = _state.ledger
    if led is not None:
        led.on_op(data)
    out = Tensor._wrap(data)
    if not _state.grad_enabled:
        return out
    prev = tuple(t.node for t in inputs if t.node is not None)
    if not prev and not force:
        return out
    node = Node(name, prev, backward, data.shape)
    if led is not None:
        arrays = []
        for s in saved:
            if isinstance(s, Tensor):
                if s.node is None or not s.node.param:
                    arrays.append(s.data)
            elif s is not None:
                arrays.append(s)
        node.saved = led.acquire(arrays, _state.phase, kind)
    out.node = node
    return out


def compute(name: str, fn, flops: int):
    """An op's forward value: fn(), counted as `flops`. Inside a selective checkpoint
    (ckptlab.checkpoint) an op the policy saves stores its value on the first pass and hands
    it back, uncomputed and uncounted, on the recompute."""
    sel = _state.selective
    if sel is not None and name in sel.policy:
        if sel.replaying:
            return sel.replay(name)
        y = fn()
        count(flops)
        sel.store(name, y)
        return y
    y = fn()
    count(flops)
    return y


def count(flops, phase: str | None = None) -> None:
    """Add FLOPs to the ledger under the current phase (or `phase`)."""
    if _state.ledger is not None:
        _state.ledger.add_flops(flops, phase or _state.phase)


# ------------------------------------------------------------------------------ backward


def _topo(root: Node) -> list:
    """Nodes reachable from root, inputs before outputs (micrograd's build_topo, iterative so
    a 256-block chain does not hit the recursion limit)."""
    order, seen, stack = [], {id(root)}, [(root, iter(root.prev))]
    while stack:
        node, children = stack[-1]
        for child in children:
            if id(child) not in seen:
                seen.add(id(child))
                stack.append((child, iter(child.prev)))
                break
        else:
            stack.pop()
            order.append(node)
    return order


def backward(root: Node, grad) -> None:
    """root.grad += grad, then every closure in reverse topological order. Each node is
    released once its closure has run (its saved arrays leave the ledger); non-leaf gradients
    are dropped unless retained."""
    order = _topo(root)
    for node in order:
        if node.backward is None and not node.leaf:
            raise RuntimeError(f"backward through {node.name}, whose graph was already freed by "
                               "an earlier backward()")
    root.add_grad(grad)
    previous, _state.phase = _state.phase, "backward"
    try:
        for node in reversed(order):
            if node.leaf:
                continue
            if node.grad is not None:
                node.backward(node.grad)
            node.backward, node.prev = None, ()
            if node.saved is not None and _state.ledger is not None:
                _state.ledger.release(node.saved, "backward")
            node.saved = None
            if not node.retain:
                node.grad = None
    finally:
        _state.phase = previous


# ------------------------------------------------------------------------------ state


@contextlib.contextmanager
def _setting(name, value):
    previous = getattr(_state, name)
    setattr(_state, name, value)
    try:
        yield
    finally:
        setattr(_state, name, previous)


def no_grad():
    """Context: ops build no graph and save nothing."""
    return _setting("grad_enabled", False)


def enable_grad():
    return _setting("grad_enabled", True)


def is_grad_enabled() -> bool:
    return _state.grad_enabled


def phase(name: str):
    """Context: count FLOPs (and ledger events) under `name` (forward/recompute/backward)."""
    return _setting("phase", name)


def current_phase() -> str:
    return _state.phase


def selective(ctx):
    return _setting("selective", ctx)


def current_selective():
    return _state.selective


def set_ledger(led):
    """Install a ledger (or None); returns the previous one. See ledger.record()."""
    previous, _state.ledger = _state.ledger, led
    return previous


def current_ledger():
    return _state.ledger


def manual_seed(seed: int) -> None:
    """Reset the dropout RNG: key `seed`, offset 0."""
    if not 0 <= int(seed) < 2**64:
        raise ValueError(f"seed: expected an int in [0, 2**64), got {seed}")
    _state.seed, _state.offset = int(seed), 0


def rng_state() -> tuple:
    return (_state.seed, _state.offset)


def set_rng_state(state) -> None:
    _state.seed, _state.offset = int(state[0]), int(state[1])


def next_rng() -> tuple:
    """(seed, offset) for one dropout call, and advance the offset: Philox is keyed by seed and
    counts (offset, element index), so each call owns a fresh, reproducible stream."""
    state = (_state.seed, _state.offset)
    _state.offset += 1
    return state


# ------------------------------------------------------------------------------ gradcheck


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
    state = rng_state()
    set_rng_state(state)
    out = fn(*inputs)
    xp = xp_of(out.data)
    R = xp.asarray(np.random.default_rng(1234).standard_normal(out.shape))  # (out.shape)

    def loss_value():
        set_rng_state(state)
        with no_grad():
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
        set_rng_state(state)
    return True


from ckptlab import ops  # noqa: E402,F401  (attaches +, -, *, /, @ and methods to Tensor)
