"""One step of the lab's MLP through a checkpoint (the learner's or the engine's), and what
it leaves behind: the bytes held when the forward ends, the gradients, the FLOPs by phase, and
the engine state (the dropout RNG, grad mode) after the forward and after the backward.

Cases, each changing one thing from "base" (a block with dropout, x a leaf that wants a
gradient): no dropout (so that a wrong RNG shows as "only with dropout"), x used twice (its
gradient from the other path must survive), two checkpoints in a row (the recompute must not
walk into the graph behind x), x that needs no gradient (a first segment: the model's input).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ckptlab.engine import tape
from ckptlab.engine.tensor import Tensor
from ckptlab.exercises.write import checkpoint_guard
from ckptlab.recompute import ledger

CASES = ("base", "no_dropout", "x_twice", "chain", "x_no_grad")


class Finding(Exception):
    """What a run found wrong before its end (the hint key and the reason), not an error."""

    def __init__(self, pattern: str, why: str):
        super().__init__(why)
        self.pattern, self.why = pattern, why


@dataclass
class Run:
    """One step through a checkpoint: bytes held when the forward ends, the gradients by name,
    FLOPs by phase, and the RNG state and grad mode after the forward and after the backward."""

    held: int
    grads: dict
    flops: dict
    after_forward: tuple  # ((seed, offset), grad mode)
    after_backward: tuple


def _returned(cp):
    """`cp`, called as the model calls it: what it returns must be one Tensor with a node
    (else a Finding saying what it returned), and grad mode must be on again after it."""
    def call(fn, x):
        y = cp(fn, x)
        if not isinstance(y, Tensor):
            what = "None" if y is None else f"a {type(y).__name__}"
            raise Finding("returns", f"your checkpoint returned {what}: it must return fn(x)'s "
                          "value as a Tensor node")
        if not checkpoint_guard.state_now()[1]:
            raise Finding("grad_mode", "grad mode is off after the forward of your checkpoint, "
                          "so the ops after it build no graph (the engine's leaves it on)")
        if y.node is None:
            raise Finding("returns", "your checkpoint returned a Tensor that is not connected "
                          "to the graph (it has no node), so no gradient can reach x or fn's "
                          "parameters: it must return fn(x)'s value as a Tensor node")
        return y
    return call


def run(cp, case: str, seed: int = 0) -> Run:
    """One step through `cp` (the learner's or the engine's checkpoint) in case `case`, from
    a fresh process's engine state."""
    from ckptlab import models

    checkpoint_guard.fresh_state()
    mlp = models.MLP(width=16, layers=2, dropout=0.0 if case == "no_dropout" else 0.25,
                     seed=seed)
    g = np.random.default_rng(seed + 1)
    x = Tensor(g.standard_normal((8, 16)))
    if case != "x_no_grad":  # x_no_grad: the model's input, a first segment's x
        x = x.detach(requires_grad=True)
    w = g.standard_normal((8, 16))
    tape.manual_seed(seed)
    call = _returned(cp)
    with ledger.record(timeline=False) as led:
        if case == "chain":
            y = call(mlp.blocks[1], call(mlp.blocks[0], x))
        else:
            y = call(mlp.blocks[0], x)
            if case == "x_twice":
                y = y + x
        held, after_forward = led.bytes, checkpoint_guard.state_now()
        (y * Tensor(w)).sum().backward()
    grads = {"x": x.grad, **{k: p.grad for k, p in mlp.params.items()}}
    return Run(held, grads, dict(led.flops), after_forward, checkpoint_guard.state_now())


def state_differs(case: str, got: Run, want: Run, when: str) -> tuple | None:
    """(hint key, reason) if the engine state `got` leaves after the `when` ("forward" or
    "backward") differs from the engine's (`want`): the RNG state, grad mode and, after the
    backward, the FLOPs of the forward and of the recompute. The backward's FLOPs may differ:
    the engine computes no gradient for an x that needs none, a learner's copy of x may."""
    mine, its = (got.after_forward, want.after_forward) if when == "forward" else \
        (got.after_backward, want.after_backward)
    if mine[0] != its[0]:
        return "rng_after", (
            f"in case {case} the dropout RNG state (seed, offset) after the {when} is {mine[0]}, "
            f"the engine's {its[0]}: the next dropout would draw the same dropout masks again")
    if mine[1] != its[1]:
        return "grad_mode", (f"in case {case} grad mode is {'on' if mine[1] else 'off'} after "
                             f"the {when}, the engine's {'on' if its[1] else 'off'}")
    counted = ("forward", "recompute")
    if when == "backward" and any(got.flops[p] != want.flops[p] for p in counted):
        landed = " (counted as backward work instead)" if got.flops["recompute"] == 0 else ""
        return "recompute_phase", (
            f"in case {case} the ledger counts {got.flops['recompute']:,} FLOPs as recompute "
            f"and {got.flops['forward']:,} as forward, the engine's "
            f"{want.flops['recompute']:,} and {want.flops['forward']:,}: your recompute is "
            f"not counted as recompute{landed}, so the hardware FLOPs (HFU) are off")
    return None
