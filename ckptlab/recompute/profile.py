"""Profiles: what each stage of a chain saves and computes, measured by running it once.

A schedule's prediction (ckptlab.recompute.schedules) needs, per stage, the bytes its forward
keeps (by buffer: its input, its output, what it made inside), its forward and backward FLOPs,
and for a selective policy what a selective checkpoint would keep instead. profile() runs each
stage on its real input under a labelling ledger and records exactly that.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ckptlab.engine import tape
from ckptlab.engine.arrays import xp_of
from ckptlab.recompute.checkpoint import checkpoint
from ckptlab.recompute.ledger import Ledger, record
from ckptlab.recompute.plan import resolve_policy


@dataclass
class StageProfile:
    """What one stage (block) of a chain saves and computes, measured by running it once.

    saved: {label: bytes} held after a forward with grad; "in" is the stage's input, "out" its
    output, other labels name buffers made inside (by op index). stored: per selective policy,
    {label: bytes} of the op outputs a selective checkpoint keeps. FLOPs: forward, backward,
    recompute done inside backward (flash attention), and per policy the forward FLOPs a
    selective recompute skips. recomputed: per set of op names run under tape.recomputing
    (the attention core), (saved {label: bytes}, recompute FLOPs inside backward) of the plain
    stage in that mode."""

    in_bytes: int
    out_bytes: int
    saved: dict
    fwd_flops: int
    bwd_flops: int
    bwd_recompute_flops: int
    stored: dict = field(default_factory=dict)
    replayed_flops: dict = field(default_factory=dict)
    recomputed: dict = field(default_factory=dict)

    def saved_under(self, ops: frozenset) -> dict:
        """{label: bytes} held after a forward with grad, ops in `ops` recomputing inside."""
        return self.recomputed[ops][0] if ops else self.saved

    def bwd_recompute_under(self, ops: frozenset) -> int:
        return self.recomputed[ops][1] if ops else self.bwd_recompute_flops


@dataclass
class Profile:
    """A chain of stages: `first` stages before the blocks and any after them run plainly;
    blocks first .. first + n_blocks - 1 are what a schedule arranges."""

    stages: list
    first: int
    n_blocks: int

    @property
    def fixed(self) -> list:
        return [not self.first <= i < self.first + self.n_blocks for i in range(len(self.stages))]


def profile(stages, x, first: int = 0, n_blocks: int | None = None, policies=(),
            recompute=()) -> Profile:
    """Run each stage once on its real input (the previous stage's output) under a labelling
    ledger, forward and backward, and record a StageProfile; with `policies`, also once under a
    selective checkpoint per policy; with `recompute` (sets of op names), once per set under
    tape.recomputing. The dropout RNG state is restored afterwards."""
    policies = [resolve_policy(p) for p in policies]
    recompute = [frozenset(ops) for ops in recompute if ops]
    n_blocks = len(stages) - first if n_blocks is None else n_blocks
    if not (0 <= first and n_blocks >= 1 and first + n_blocks <= len(stages)):
        raise ValueError(f"profile: blocks {first}..{first + n_blocks - 1} do not fit in "
                         f"{len(stages)} stages")
    state, out = tape.rng_state(), []

    def run(stage, x, policy, ops=frozenset()):
        t = x.detach(requires_grad=x.requires_grad)  # an activation leaf, never a parameter
        led = Ledger(timeline=False, labels=True)
        led.rename(t.data, "in")
        with record(led), tape.recomputing(ops):
            y = checkpoint(stage, t, policy=policy) if policy else stage(t)
            led.rename(y.data, "out")
            held = led.held_by_label()
            if y.requires_grad:
                y.backward(xp_of(y.data).ones_like(y.data))
        return y, held, led.flops

    try:
        for stage in stages:
            y, saved, flops = run(stage, x, None)
            prof = StageProfile(int(x.data.nbytes), int(y.data.nbytes), saved,
                                flops["forward"], flops["backward"], flops["recompute"])
            for policy in policies:
                _, held, f = run(stage, x, policy)
                prof.stored[policy] = {k: b for k, b in held.items() if k != "in"}
                recomputed = f["recompute"] - prof.bwd_recompute_flops
                prof.replayed_flops[policy] = prof.fwd_flops - recomputed
            for ops in recompute:
                _, held, f = run(stage, x, None, ops)
                prof.recomputed[ops] = (held, f["recompute"])
            out.append(prof)
            x = y.detach(requires_grad=y.requires_grad)
    finally:
        tape.set_rng_state(state)
    return Profile(out, first, n_blocks)
