"""The tape of the autograd engine: graph nodes, backward, and the engine's state.

One departure from micrograd, and it is the point of this lab: the graph is made of `Node`s,
not of Tensors. A Node holds its inputs' Nodes, its closure and the ledger keys of the arrays
that closure saved; never an input's array unless the op saved it. So the graph keeps alive
exactly what the ledger (ckptlab.recompute.ledger) counts, and an activation nobody saved is
freed as soon as the Python code drops it. Once a node's backward has run, its closure and
saved arrays are released.

Engine state (one per process): grad mode (`no_grad()`), the phase ("forward", "recompute",
"backward") FLOPs are counted under, the dropout RNG state (seed, offset), the ledger (any
object with on_op/acquire/release/add_flops; installed by ledger.record()), a ValueStore
while a selective checkpoint stores or replays op outputs, the names of the ops that
recompute their insides in the backward instead of saving them (`recomputing()`: the attention
core, for Korthikanti et al.'s selective recompute), and a Trace while a checkpoint records
which ops its function runs (to compare the recompute with the first pass).

This module imports nothing of ckptlab: tensor.py, ops.py and layers.py build on it.
"""

from __future__ import annotations

import contextlib

PHASES = ("forward", "recompute", "backward")


class _State:
    grad_enabled = True
    phase = "forward"
    seed = 0
    offset = 0  # advanced by one for each dropout call: a counter-based RNG needs no more
    ledger = None
    store = None  # a ValueStore while a selective checkpoint stores or replays
    recompute_ops = frozenset()  # ops that save only their inputs and recompute the rest
    trace = None  # a Trace while a checkpoint records the ops its function runs


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


# ------------------------------------------------------------------------------ op values


class ReplayError(RuntimeError):
    """A replay asked for op outputs in another order, or another number, than were stored."""


class ValueStore:
    """Outputs of the ops named in `names`, kept on a first pass (store) and handed back, in
    the same order, on a second pass (replay) instead of being computed again. This is how a
    selective checkpoint (ckptlab.recompute.checkpoint) keeps matmul outputs, say, while the
    cheap ops around them are recomputed."""

    def __init__(self, names: frozenset):
        self.names, self.values, self.replaying, self.next = frozenset(names), [], False, 0

    def store(self, name, value) -> None:
        self.values.append((name, value))

    def replay(self, name):
        if self.next >= len(self.values) or self.values[self.next][0] != name:
            raise ReplayError(f"selective checkpoint: the recompute asked for op {name!r} as "
                              f"stored value {self.next}, but the first pass stored "
                              f"{[n for n, _ in self.values]}: fn ran different ops")
        self.next += 1
        return self.values[self.next - 1][1]

    def start_replay(self) -> None:
        self.replaying, self.next = True, 0

    def check_used_all(self) -> None:
        if self.next != len(self.values):
            raise ReplayError(f"selective checkpoint: the recompute used {self.next} of "
                              f"{len(self.values)} stored values")


class Trace:
    """The ops a checkpointed function ran, in order, as (name, output shape, dtype), and
    whether any of them read a tensor that requires grad. Both passes of a checkpoint record
    one; the recompute must match the first (what PyTorch's default check compares through
    the tensors each pass saves: the first pass here runs under no_grad and saves none)."""

    __slots__ = ("ops", "grad")

    def __init__(self):
        self.ops, self.grad = [], False

    def record(self, name: str, data, inputs) -> None:
        self.ops.append((name, tuple(data.shape), data.dtype))
        self.grad = self.grad or any(t.node is not None for t in inputs)


@contextlib.contextmanager
def tracing(trace: Trace | None):
    """Context: ops record themselves into `trace` (None: into nothing). On exit what was
    recorded is appended to the enclosing trace too, so an outer checkpoint sees the ops of
    an inner one, as its first pass (run under no_grad, without the inner checkpoint) did."""
    previous, _state.trace = _state.trace, trace
    try:
        yield trace
    finally:
        _state.trace = previous
        if previous is not None and trace is not None:
            previous.ops += trace.ops
            previous.grad = previous.grad or trace.grad


def compute(name: str, fn, flops: int):
    """An op's forward value: fn(), counted as `flops`. While a ValueStore is installed, an op
    it names stores its value on the first pass and hands it back, uncomputed and uncounted,
    on the replay."""
    store = _state.store
    if store is not None and name in store.names:
        if store.replaying:
            return store.replay(name)
        y = fn()
        count(flops)
        store.store(name, y)
        return y
    y = fn()
    count(flops)
    return y


def count(flops, phase: str | None = None) -> None:
    """Add FLOPs to the ledger under the current phase (or `phase`)."""
    if _state.ledger is not None:
        _state.ledger.add_flops(flops, phase or _state.phase)


# ------------------------------------------------------------------------------ backward


def _topo(roots) -> list:
    """Nodes reachable from the roots, inputs before outputs (micrograd's build_topo,
    iterative so that a 256-block chain does not hit the recursion limit)."""
    order, seen = [], set()
    for root in roots:
        if id(root) in seen:
            continue
        seen.add(id(root))
        stack = [(root, iter(root.prev))]
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


def backward(root, grad) -> None:
    """root.grad += grad, then every closure in reverse topological order. Each node is
    released once its closure has run (its saved arrays leave the ledger); non-leaf gradients
    are dropped unless retained. `root` and `grad` may be lists (several outputs, one pass)."""
    roots, grads = (list(root), list(grad)) if isinstance(root, (list, tuple)) else \
        ([root], [grad])
    order = _topo(roots)
    for node in order:
        if node.backward is None and not node.leaf:
            raise RuntimeError(f"backward through {node.name}, whose graph was already freed by "
                               "an earlier backward()")
    for r, g in zip(roots, grads, strict=True):
        r.add_grad(g)
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


def free(roots) -> None:
    """Drop the graph behind `roots` without a backward: its closures go, and what they saved
    leaves the ledger (a recompute's output that no gradient reached, say)."""
    for node in _topo(list(roots)):
        if node.leaf or node.backward is None:
            continue
        node.backward, node.prev = None, ()
        if node.saved is not None and _state.ledger is not None:
            _state.ledger.release(node.saved, "backward")
        node.saved = None


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
    if name not in PHASES:
        raise ValueError(f"phase: expected one of {PHASES}, got {name!r}")
    return _setting("phase", name)


def current_phase() -> str:
    return _state.phase


def storing(store: ValueStore | None):
    """Context: ops named by `store` store (or, replaying, take back) their outputs."""
    return _setting("store", store)


def current_store() -> ValueStore | None:
    return _state.store


# ops that can recompute their insides in the backward (recomputing() accepts these names)
RECOMPUTABLE = frozenset({"attention"})


def recomputing(names):
    """Context: ops named here (RECOMPUTABLE) save only their inputs and redo the rest of their
    forward in their backward (counted as "recompute"). The choice is made when the op runs,
    so the backward may run outside the context."""
    names = frozenset(names)
    if names - RECOMPUTABLE:
        raise ValueError(f"recomputing: {sorted(names - RECOMPUTABLE)} cannot recompute their "
                         f"insides; expected names from {sorted(RECOMPUTABLE)}")
    return _setting("recompute_ops", names)


def recompute_ops() -> frozenset:
    """The op names that recompute their insides now (see recomputing())."""
    return _state.recompute_ops


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
