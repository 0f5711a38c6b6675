"""Segment (activation) checkpointing: store a segment's input, recompute its inside.

checkpoint(fn, x) runs fn under no_grad, so nothing inside is saved; the graph gets one node
holding x. Its backward re-runs fn with grad on a detached copy of x (the RNG state restored,
so dropout redraws the same masks), backpropagates through that local graph, and hands x its
gradient. Nested checkpoints work: a recompute builds inner checkpoint nodes in turn.
run_plan runs a chain of blocks as a plan (ckptlab.recompute.plan) says.
"""

from __future__ import annotations

from ckptlab.engine import tape
from ckptlab.engine.tape import ReplayError
from ckptlab.engine.tensor import Tensor, make
from ckptlab.recompute.plan import Seg, check_plan, resolve_policy, uniform_plan

CHECKS = ("none", "shape", "value")


class DeterminismError(ReplayError):
    """A checkpoint's recompute did not reproduce its first forward."""


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
    if not tape.is_grad_enabled():
        return _output(fn(*inputs))
    if tape.current_store() is not None:
        raise RuntimeError("checkpoint: a checkpoint inside a selective checkpoint's recompute "
                           "is not supported (the replayed values would be misattributed)")
    rng_state = tape.rng_state()
    recompute_ops = tape.recompute_ops()  # the recompute runs its ops as the first pass did
    store = tape.ValueStore(policy) if policy is not None else None
    with tape.no_grad(), tape.storing(store):
        y = _output(fn(*inputs))
    first = y.data if determinism_check == "value" else None
    shape, dtype = y.shape, y.dtype
    stored = [v for _, v in store.values] if store is not None else []

    def backward(g):
        now = tape.rng_state()
        if preserve_rng_state:
            tape.set_rng_state(rng_state)
        if store is not None:
            store.start_replay()
        try:
            local = [_local(x) for x in inputs]
            with tape.enable_grad(), tape.phase("recompute"), \
                    tape.storing(store), tape.recomputing(recompute_ops):
                y2 = _output(fn(*local))
        finally:
            if preserve_rng_state:
                tape.set_rng_state(now)
        if store is not None:
            store.check_used_all()
        _check(y2, shape, dtype, first)
        if y2.node is not None:
            tape.backward(y2.node, g)
        for x, xl in zip(inputs, local, strict=True):
            if x.node is not None and xl.grad is not None:
                x.node.add_grad(xl.grad)

    out = make(y.data, "checkpoint", inputs, backward, saved=inputs, force=True,
                        kind="checkpoint")  # the snapshot: inputs held until the backward
    led = tape.current_ledger()
    extra = stored + ([first] if first is not None else [])
    if led is not None and extra:
        out.node.saved += led.acquire(extra, tape.current_phase(), "stored")
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
                          determinism_check: str = "shape") -> Tensor:
    """Run blocks[0], blocks[1], ... on x, checkpointed.

    segments=k: k uniform checkpointed segments (as torch.utils.checkpoint.checkpoint_sequential,
    except that the last segment is checkpointed too). plan: a plan (ckptlab.recompute.plan)
    or anything with a .plan (a schedules.Schedule; build one from a spec string with
    schedules.make). Neither: no checkpointing. The options go to checkpoint()."""
    blocks = list(blocks)
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
