"""Plans: what a chain of blocks does, written as data before it runs.

A plan is a list whose items are block indices (run with grad, activations saved) or Segs
(checkpointed: only the segment's input is kept, the inside is recomputed in the backward; a
Seg's items are again indices or Segs):
    [0, 1, 2, 3]                      no checkpointing
    [Seg([0, 1]), Seg([2, 3])]        two checkpointed segments (uniform, "every(2)")
    [Seg([Seg([0]), 1]), 2, 3]        nested: a segment whose recompute checkpoints again
A Seg with a `policy` is selective: its first pass stores the outputs of the ops the policy
names (matmuls, say), and the recompute reuses them instead of recomputing them.
checkpoint.run_plan runs a plan; schedules builds them and predicts what they hold.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptlab.engine.ops import REPLAYABLE

# selective policies by name: the ops whose outputs a selective segment keeps
POLICIES = {"matmul": frozenset({"matmul", "linear"})}


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


def uniform_plan(L: int, segments: int) -> list:
    """`segments` checkpointed segments of near-equal length over blocks 0..L-1 (sizes differ
    by at most one)."""
    if isinstance(L, bool) or not isinstance(L, int) or L < 1:
        raise ValueError(f"L: expected a number of blocks >= 1, got {L!r}")
    if isinstance(segments, bool) or not isinstance(segments, int) or not 1 <= segments <= L:
        raise ValueError(f"segments: expected an int in [1, {L}], got {segments!r}")
    edges = [round(k * L / segments) for k in range(segments + 1)]
    return [Seg(range(a, b)) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def pytorch_sequential_plan(L: int, segments: int) -> list:
    """The plan torch.utils.checkpoint.checkpoint_sequential(functions, segments, input) runs:
    segments - 1 checkpointed chunks of L // segments blocks each, then the remaining blocks
    run plainly (PyTorch keeps the last chunk out: its backward comes first, so recomputing it
    would save nothing). segments = 1: no checkpoint at all."""
    if isinstance(L, bool) or not isinstance(L, int) or L < 1:
        raise ValueError(f"L: expected a number of blocks >= 1, got {L!r}")
    if isinstance(segments, bool) or not isinstance(segments, int) or not 1 <= segments <= L:
        raise ValueError(f"segments: expected an int in [1, {L}] (the number of blocks), got "
                         f"{segments!r}")
    size = L // segments
    return ([Seg(range(k * size, (k + 1) * size)) for k in range(segments - 1)]
            + list(range((segments - 1) * size, L)))
