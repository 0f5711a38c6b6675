"""Segment (activation) checkpointing: store a segment's input, recompute its inside.

checkpoint(fn, x) runs fn under no_grad, so nothing inside is saved; the graph gets one node
holding x. Its backward re-runs fn with grad on a detached copy of x (the RNG state restored,
so dropout redraws the same masks), backpropagates through that local graph, and hands x its
gradient. Nested checkpoints work: a recompute builds inner checkpoint nodes in turn.

A plan says what a chain of blocks does (ckptlab.schedules builds them): a list whose items are
block indices (run with grad, activations saved) or Segs (checkpointed; their items again).
    [0, 1, 2, 3]                      no checkpointing
    [Seg([0, 1]), Seg([2, 3])]        two checkpointed segments (uniform, "every(2)")
    [Seg([Seg([0]), 1]), 2, 3]        nested: a segment whose recompute checkpoints again
A Seg with a `policy` is selective: its first pass stores the outputs of the ops the policy
names (matmuls, say), and the recompute reuses them instead of recomputing them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptlab import autograd
from ckptlab.autograd import Tensor
from ckptlab.ops import REPLAYABLE

CHECKS = ("none", "shape", "value")
POLICIES = {"matmul": frozenset({"matmul", "linear"})}


class DeterminismError(RuntimeError):
    """A checkpoint's recompute did not reproduce its first forward."""


class _Selective:
    """The values a selective checkpoint stores on its first pass and replays on recompute."""

    def __init__(self, policy: frozenset):
        self.policy, self.values, self.replaying, self.next = policy, [], False, 0

    def store(self, name, value):
        self.values.append((name, value))

    def replay(self, name):
        if self.next >= len(self.values) or self.values[self.next][0] != name:
            raise DeterminismError(f"selective checkpoint: the recompute asked for op {name!r} "
                                   f"as stored value {self.next}, but the first pass stored "
                                   f"{[n for n, _ in self.values]}: fn ran different ops")
        self.next += 1
        return self.values[self.next - 1][1]


def resolve_policy(policy) -> frozenset:
    """A policy: a preset name ("matmul") or op names, each one whose output can be replayed."""
    names = POLICIES.get(policy) if isinstance(policy, str) else None
    if names is None:
        names = frozenset([policy] if isinstance(policy, str) else policy)
    bad = sorted(names - REPLAYABLE)
    if bad or not names:
        raise ValueError(f"policy: {sorted(names)} has ops whose outputs cannot be stored and "
                         f"replayed ({bad}); expected a preset {sorted(POLICIES)} or names from "
                         f"{sorted(REPLAYABLE)}")
    return names


def checkpoint(fn, *inputs, preserve_rng_state: bool = True, determinism_check: str = "shape",
               policy=None) -> Tensor:
    """y = fn(*inputs), holding only `inputs` (and, with a policy, the stored op outputs).

    preserve_rng_state=False is the classic bug, kept for the labs: the recompute draws new
    dropout masks, so the gradient is silently wrong. determinism_check: "shape" compares the
    recomputed output's shape and dtype (cheap, like PyTorch's default), "value" also its
    values bit for bit (keeps a reference to the original output; the ledger counts it),
    "none" skips the check."""
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
    for k, x in enumerate(inputs):
        if not isinstance(x, Tensor):
            raise TypeError(f"inputs[{k}]: expected a Tensor, got {type(x).__name__}")
    if determinism_check not in CHECKS:
        raise ValueError(f"determinism_check: expected one of {CHECKS}, got "
                         f"{determinism_check!r}")
    policy = resolve_policy(policy) if policy is not None else None
    if not autograd.is_grad_enabled():
        return _output(fn(*inputs))
    if autograd.current_selective() is not None:
        raise RuntimeError("checkpoint: a checkpoint inside a selective checkpoint's recompute "
                           "is not supported (the replayed values would be misattributed)")
    rng_state = autograd.rng_state()
    store = _Selective(policy) if policy is not None else None
    with autograd.no_grad(), autograd.selective(store):
        y = _output(fn(*inputs))
    first = y.data if determinism_check == "value" else None
    shape, dtype = y.shape, y.dtype
    stored = [v for _, v in store.values] if store is not None else []

    def backward(g):
        now = autograd.rng_state()
        if preserve_rng_state:
            autograd.set_rng_state(rng_state)
        if store is not None:
            store.replaying, store.next = True, 0
        try:
            local = [_local(x) for x in inputs]
            with autograd.enable_grad(), autograd.phase("recompute"), \
                    autograd.selective(store):
                y2 = _output(fn(*local))
        finally:
            if preserve_rng_state:
                autograd.set_rng_state(now)
        if store is not None and store.next != len(store.values):
            raise DeterminismError(f"selective checkpoint: the recompute used {store.next} of "
                                   f"{len(store.values)} stored values")
        _check(y2, shape, dtype, first)
        if y2.node is not None:
            autograd.backward(y2.node, g)
        for x, xl in zip(inputs, local, strict=True):
            if x.node is not None and xl.grad is not None:
                x.node.add_grad(xl.grad)

    out = autograd.make(y.data, "checkpoint", inputs, backward, saved=inputs, force=True,
                        kind="checkpoint")  # the snapshot: inputs held until the backward
    led = autograd.current_ledger()
    extra = stored + ([first] if first is not None else [])
    if led is not None and extra:
        out.node.saved += led.acquire(extra, autograd.current_phase(), "stored")
    return out


def _local(x: Tensor) -> Tensor:
    """The recompute's copy of an input: same array, no history, a leaf if x wants a grad."""
    t = x.detach()
    if x.node is not None:
        t._make_leaf(param=x.node.param)
    return t


def _output(y) -> Tensor:
    if not isinstance(y, Tensor):
        raise TypeError(f"checkpoint: fn must return one Tensor, got {type(y).__name__}")
    return y


def _check(y2: Tensor, shape, dtype, first) -> None:
    if y2.shape != shape or y2.dtype != dtype:
        raise DeterminismError(f"checkpoint: the recompute returned {y2.shape} {y2.dtype}, the "
                               f"first forward {shape} {dtype}")
    if first is not None and not (y2.data == first).all():
        diff = float(abs(y2.data - first).max())
        raise DeterminismError(
            f"checkpoint: the recomputed output differs from the first forward (max |diff| = "
            f"{diff:.3g}, shape {shape}). Something random was redrawn: dropout with "
            "preserve_rng_state=False draws new masks on recompute.")


# ------------------------------------------------------------------------------ plans


@dataclass(frozen=True)
class Seg:
    """A checkpointed segment of a plan: items are block indices or nested Segs."""

    items: tuple
    policy: frozenset | None = None

    def __init__(self, items, policy=None):
        object.__setattr__(self, "items", tuple(items))
        object.__setattr__(self, "policy", resolve_policy(policy) if policy else None)

    def blocks(self) -> list:
        """The block indices this segment covers, in order."""
        return plan_blocks(self.items)

    def __repr__(self):
        inner = ", ".join(repr(i) for i in self.items)
        return f"sel[{inner}]" if self.policy else f"[{inner}]"


def plan_blocks(items) -> list:
    out = []
    for item in items:
        out.extend(item.blocks() if isinstance(item, Seg) else [item])
    return out


def check_plan(plan, n: int) -> list:
    """A plan must cover blocks 0..n-1 once each, in order."""
    plan = list(plan)
    got = plan_blocks(plan)
    if got != list(range(n)):
        raise ValueError(f"plan: expected to cover blocks 0..{n - 1} in order, got {got}")
    return plan


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


def checkpoint_sequential(blocks, x: Tensor, segments: int | None = None, schedule=None,
                          **kwargs) -> Tensor:
    """Run blocks[0], blocks[1], ... on x, checkpointed.

    segments=k: k uniform checkpointed segments (as torch.utils.checkpoint.checkpoint_sequential,
    except that the last segment is checkpointed too). schedule: a schedules.Schedule, a plan,
    or a spec string ("none", "sqrt", "every(4)", "revolve(3)", "selective(matmul)"; budgeted
    ones need a profile: build them with schedules.make). kwargs go to checkpoint()."""
    from ckptlab import schedules

    blocks = list(blocks)
    if segments is not None and schedule is not None:
        raise ValueError("give segments or schedule, not both")
    if segments is not None:
        plan = schedules.uniform(len(blocks), segments).plan
    elif schedule is None:
        plan = list(range(len(blocks)))
    elif isinstance(schedule, str):
        plan = schedules.make(schedule, len(blocks)).plan
    elif isinstance(schedule, schedules.Schedule):
        plan = schedule.plan
    else:
        plan = schedule
    return run_plan(blocks, check_plan(plan, len(blocks)), x, **kwargs)
