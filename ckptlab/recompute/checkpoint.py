"""Segment (activation) checkpointing: store a segment's input, recompute its inside.

checkpoint(fn, x) runs fn under no_grad, so nothing inside is saved; the graph gets one node
holding x. Its backward re-runs fn with grad on a detached copy of x (the RNG state restored,
so dropout redraws the same masks), backpropagates through that local graph, and hands x its
gradient. Nested checkpoints work: a recompute builds inner checkpoint nodes in turn.
Arguments that are not Tensors (None, numbers, ...) pass through to fn as they are; fn may
return anything, as torch.utils.checkpoint(use_reentrant=False) allows: a Tensor, a tuple
(Tensors and other values), or no Tensor at all (returned as it is). As there, an output
requires grad only if it was computed from a tensor that does (an input, or a parameter fn
reads), and an input returned unchanged is returned as itself.
run_plan runs a chain of blocks as a plan (ckptlab.recompute.plan) says.
"""

from __future__ import annotations

import weakref
import zlib

import numpy as np

from ckptlab.engine import tape
from ckptlab.engine.arrays import xp_of
from ckptlab.engine.tape import ReplayError
from ckptlab.engine.tensor import Tensor, make
from ckptlab.recompute.plan import (
    Seg,
    check_plan,
    pytorch_sequential_plan,
    resolve_policy,
    uniform_plan,
)

CHECKS = ("none", "default", "value")


class DeterminismError(ReplayError):
    """A checkpoint's recompute did not reproduce its first forward."""


def checkpoint(fn, *args, preserve_rng_state: bool = True, determinism_check: str = "default",
               policy=None, **kwargs):
    """y = fn(*args, **kwargs), holding only the Tensor arguments (and, with a policy, the
    stored op outputs) until the backward, where fn runs again. Keyword arguments go to fn, as
    PyTorch's non-reentrant checkpoint passes them (Tensors among them get gradients like
    positional ones); the three options here are the only names fn cannot receive.

    preserve_rng_state=False is the classic bug, kept for the labs: the recompute draws new
    dropout masks, so the gradient is silently wrong. determinism_check:
      "default"  as PyTorch's default: the recompute must run the same ops, in the same order,
                 with outputs of the same shapes and dtypes (PyTorch compares the tensors each
                 pass saves; here the first pass saves nothing, so every op's output is
                 compared), and the Tensor arguments must not have changed in place, inside
                 fn or between forward and backward (a checksum of their bytes: CRC-32 with
                 NumPy; on a GPU the sum of the bytes, which a permutation passes);
      "value"    also the output's values, bit for bit (keeps a reference to the first output;
                 the ledger counts it): catches a redrawn dropout mask;
      "none"     no check, no checksums.
    A checkpoint whose function reads no tensor that requires grad returns outputs that do not
    require grad either, so backward() through them raises, as in PyTorch."""
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
    if kwargs:  # the keyword values become trailing positional arguments of a wrapper
        names, n = list(kwargs), len(args)

        def positional(*xs):
            return fn(*xs[:n], **dict(zip(names, xs[n:], strict=True)))

        return checkpoint(positional, *args, *kwargs.values(),
                          preserve_rng_state=preserve_rng_state,
                          determinism_check=determinism_check, policy=policy)
    if determinism_check not in CHECKS:
        raise ValueError(f"determinism_check: expected one of {CHECKS}, got "
                         f"{determinism_check!r}")
    policy = resolve_policy(policy) if policy is not None else None
    if not tape.is_grad_enabled():
        return fn(*args)
    if tape.current_store() is not None:
        raise RuntimeError("checkpoint: a checkpoint inside a selective checkpoint's recompute "
                           "is not supported (the replayed values would be misattributed)")
    tensors = [x for x in args if isinstance(x, Tensor)]
    check = determinism_check != "none"
    sums = _checksums(tensors) if check else None
    rng_state = tape.rng_state()
    recompute_ops = tape.recompute_ops()  # the recompute runs its ops as the first pass did
    store = tape.ValueStore(policy) if policy is not None else None
    with tape.no_grad(), tape.storing(store), tape.tracing(_Taint()) as first:
        y, outs = _outputs(fn(*args))
    # what PyTorch's first pass (run with grad) would give each output: a gradient only if it
    # was computed from a tensor that requires grad; an input returned as it is stays itself
    wants = [not _is_input(o, tensors) and first.carries(o) for o in outs]
    if check:
        _same_inputs(tensors, sums, "fn changed it in place during the first forward")
    stored = [v for _, v in store.values] if store is not None else []
    kept = [o.data for o in outs] if determinism_check == "value" else None
    meta = [(o.shape, o.dtype) for o in outs]
    if not any(wants):  # no output wants a gradient: no node, as PyTorch's would have none
        return y

    def recompute(grads):
        if check:
            _same_inputs(tensors, sums, "it was changed in place between the forward and the "
                                        "backward")
        now = tape.rng_state()
        if preserve_rng_state:
            tape.set_rng_state(rng_state)
        if store is not None:
            store.start_replay()
        try:
            local = [_local(x) if isinstance(x, Tensor) else x for x in args]
            with tape.enable_grad(), tape.phase("recompute"), tape.storing(store), \
                    tape.recomputing(recompute_ops), tape.tracing(tape.Trace()) as second:
                _, outs2 = _outputs(fn(*local))
        finally:
            if preserve_rng_state:
                tape.set_rng_state(now)
        if store is not None:
            store.check_used_all()
        if check:
            _check(first.ops, second.ops, meta, outs2, kept)
        pairs = [(o.node, g) for o, g, w in zip(outs2, grads, wants, strict=True)
                 if w and o.node is not None and g is not None]
        if pairs:
            tape.backward([n for n, _ in pairs], [g for _, g in pairs])
        tape.free(o.node for o in outs2 if o.node is not None)  # outputs no gradient reached
        for x, xl in zip(args, local, strict=True):
            if isinstance(x, Tensor) and x.node is not None and xl.grad is not None:
                x.node.add_grad(xl.grad)

    with tape.tracing(None):  # this node is not one of fn's ops (an outer trace has them)
        if not isinstance(y, tuple):
            out = make(y.data, "checkpoint", tensors, lambda g: recompute([g]), saved=tensors,
                       force=True, kind="checkpoint")  # the snapshot: inputs held until backward
            hub = out.node
        else:
            hub, out = _tuple_node(y, outs, wants, tensors, recompute)
    led = tape.current_ledger()
    extra = stored + (kept or [])
    if led is not None and extra:
        hub.saved += led.acquire(extra, tape.current_phase(), "stored")
    return out


def _tuple_node(y: tuple, outs: list, wants: list, tensors: list, recompute):
    """A tuple output: one node holds the snapshot and recomputes once, with the gradients of
    all outputs; each output Tensor that wants a gradient gets a node that hands its gradient
    to that one (the others are returned as they are: no gradient, or the input itself)."""
    grads = [None] * len(outs)
    hub = make(outs[0].data if outs else np.zeros(()), "checkpoint", tensors,
               lambda _: recompute(grads), saved=tensors, force=True, kind="checkpoint").node
    hub.shape = None  # gradients reach it only through the outputs' nodes below

    def hand_over(k):
        def backward(g):
            grads[k] = g if grads[k] is None else grads[k] + g
            hub.grad = grads  # marks the node as reached
        return backward

    result, k = [], 0
    for item in y:
        if isinstance(item, Tensor) and not wants[k]:
            result.append(item)
            k += 1
        elif isinstance(item, Tensor):
            t = Tensor._wrap(item.data)
            t.node = tape.Node("checkpoint output", (hub,), hand_over(k), item.data.shape)
            result.append(t)
            k += 1
        else:
            result.append(item)
    return hub, tuple(result)


def _local(x: Tensor) -> Tensor:
    """The recompute's copy of an input: same array, no history, a leaf if x wants a grad."""
    t = x.detach()
    if x.node is not None:
        t._make_leaf(param=x.node.param)
    return t


def _outputs(y) -> tuple:
    """(y, the Tensors in it): y itself, or the Tensors of a tuple (none: [])."""
    outs = [y] if isinstance(y, Tensor) else \
        [t for t in y if isinstance(t, Tensor)] if isinstance(y, tuple) else []
    return y, outs


def _is_input(o: Tensor, tensors: list) -> bool:
    return any(o is x for x in tensors)


class _Taint(tape.Trace):
    """The first pass's trace, which also follows which arrays were computed from a tensor
    that requires grad (one with a node, or an array computed from one), by weak reference:
    what decides, as PyTorch's graph would, whether an output wants a gradient."""

    __slots__ = ("tainted",)

    def __init__(self):
        super().__init__()
        self.tainted = {}  # id(array) -> weakref to it (its id may be reused once it is freed)

    def _marked(self, data) -> bool:
        ref = self.tainted.get(id(data))
        return ref is not None and ref() is data

    def carries(self, t: Tensor) -> bool:
        """t requires grad, or was computed from a tensor that does."""
        return t.node is not None or self._marked(t.data)

    def record(self, name: str, data, inputs) -> None:
        super().record(name, data, inputs)
        if any(self.carries(t) for t in inputs):
            key, marks = id(data), self.tainted

            def forget(ref, key=key):  # the array is freed: its id may be reused
                if marks.get(key) is ref:
                    del marks[key]

            try:
                marks[key] = weakref.ref(data, forget)
            except TypeError:  # an array type without weak references: hold it
                marks[key] = lambda data=data: data


def _checksum(a):
    """A checksum of an array's bytes: CRC-32 for NumPy; on a GPU (CuPy) the sum of the bytes
    on the device (a permutation of the bytes passes)."""
    if isinstance(a, np.ndarray):
        return zlib.crc32(np.ascontiguousarray(a).reshape(-1).view(np.uint8))
    xp = xp_of(a)
    return xp.ascontiguousarray(a).reshape(-1).view(xp.uint8).sum(dtype=xp.uint64)


def _checksums(tensors) -> list:
    return [_checksum(x.data) for x in tensors]


def _same_inputs(tensors, sums, why: str) -> None:
    for k, (x, s) in enumerate(zip(tensors, sums, strict=True)):
        if int(_checksum(x.data)) != int(s):
            raise DeterminismError(
                f"checkpoint: Tensor argument {k} (shape {x.shape}) is not what the first "
                f"forward read: {why}. The recompute would use the new values and give a wrong "
                "gradient: do not modify a checkpoint's inputs in place (use ops that return "
                "new tensors, or pass a copy).")


def _op(ops: list, k: int) -> str:
    return f"{ops[k][0]} -> {ops[k][1]} {ops[k][2]}" if k < len(ops) else "nothing (it stopped)"


def _check(first: list, second: list, meta: list, outs2: list, kept) -> None:
    """The recompute ran the ops of the first pass, and returned the same outputs."""
    if first != second:
        k = next((i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b),
                 min(len(first), len(second)))
        raise DeterminismError(
            f"checkpoint: the recompute ran other ops than the first forward ({len(second)} "
            f"ops, the first pass {len(first)}): op {k} was {_op(first, k)} in the first "
            f"forward, {_op(second, k)} in the recompute. fn must run the same ops each call.")
    got = [(o.shape, o.dtype) for o in outs2]
    if got != meta:
        raise DeterminismError(f"checkpoint: the recompute returned {got}, the first forward "
                               f"{meta}")
    for k, (o, y) in enumerate(zip(outs2, kept, strict=True) if kept is not None else ()):
        if not (o.data == y).all():
            diff = float(abs(o.data - y).max())
            raise DeterminismError(
                f"checkpoint: recomputed output {k} differs from the first forward (max |diff| "
                f"= {diff:.3g}, shape {o.shape}) though fn ran the same ops on unchanged "
                "inputs: something it reads besides its arguments changed. Most often a "
                "random draw (dropout with preserve_rng_state=False draws new masks on "
                "recompute); else a parameter or other state fn reads, changed in between.")


def run_plan(blocks, plan, x: Tensor, **kwargs) -> Tensor:
    """Run a chain of blocks as `plan` says; kwargs go to checkpoint()."""
    for item in plan:
        if isinstance(item, Seg):
            def segment(t, seg=item):
                return run_plan(blocks, seg.items, t, **kwargs)
            x = checkpoint(segment, x, policy=item.policy, **kwargs)
        else:
            x = blocks[item](x)
    return x


def checkpoint_sequential(blocks, x: Tensor, segments: int | None = None, plan=None, *,
                          preserve_rng_state: bool = True,
                          determinism_check: str = "default") -> Tensor:
    """Run blocks[0], blocks[1], ... on x, checkpointed.

    segments=k: k uniform checkpointed segments (as torch.utils.checkpoint.checkpoint_sequential,
    except that the last segment is checkpointed too). plan: a plan (ckptlab.recompute.plan)
    or anything with a .plan (a schedules.Schedule; build one from a spec string with
    schedules.make). Neither: no checkpointing. The options go to checkpoint().
    PyTorch's call, checkpoint_sequential(blocks, segments, x) (an int where x goes), runs the
    plan PyTorch runs: pytorch_sequential_plan (the last chunk not checkpointed)."""
    blocks = list(blocks)
    if isinstance(x, int) and not isinstance(x, bool) and plan is None:  # PyTorch's order
        return run_plan(blocks, pytorch_sequential_plan(len(blocks), x), segments,
                        preserve_rng_state=preserve_rng_state,
                        determinism_check=determinism_check)
    if segments is not None and plan is not None:
        raise ValueError("give segments or plan, not both")
    if segments is not None:
        plan = uniform_plan(len(blocks), segments)
    elif plan is None:
        plan = list(range(len(blocks)))
    elif isinstance(plan, str):
        raise TypeError(f"plan: got the spec {plan!r}; build the plan with "
                        "ckptlab.recompute.schedules.make(spec, L) first")
    plan = getattr(plan, "plan", plan)
    return run_plan(blocks, check_plan(plan, len(blocks)), x,
                    preserve_rng_state=preserve_rng_state, determinism_check=determinism_check)
