"""ckptlab's selective policies as PyTorch selective activation checkpointing (SAC) policies.

A ckptlab policy names engine ops whose outputs a selective segment keeps ("matmul": matmul
and linear). In PyTorch the same choice is a policy function over ATen ops, used through
torch.utils.checkpoint.create_selective_checkpoint_contexts:

    from torch.utils.checkpoint import checkpoint
    y = checkpoint(block, x, use_reentrant=False, context_fn=context_fn("matmul"))

The ops each engine op becomes in ATen are listed in ATEN below (linear: addmm with a bias,
mm without; matmul: mm, or bmm for batched operands).
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from ckptlab.recompute.plan import resolve_policy

_a = torch.ops.aten
ATEN = {
    "matmul": (_a.mm, _a.bmm),
    "linear": (_a.addmm, _a.mm),
    "add": (_a.add,), "sub": (_a.sub,), "mul": (_a.mul,), "div": (_a.div,),
    "relu": (_a.relu,), "gelu": (_a.gelu,), "tanh": (_a.tanh,), "exp": (_a.exp,),
    "log": (_a.log,), "softmax": (_a._softmax,), "embedding": (_a.embedding,),
}


def aten_ops(policy) -> frozenset:
    """The ATen op packets (aten.mm, ...) whose outputs a ckptlab policy keeps."""
    names = resolve_policy(policy)
    missing = sorted(n for n in names if n not in ATEN)
    if missing:
        raise ValueError(f"policy: no ATen ops known for {missing}; known: {sorted(ATEN)}")
    return frozenset(op for n in names for op in ATEN[n])


def sac_policy(policy):
    """A policy function for create_selective_checkpoint_contexts: MUST_SAVE the outputs of
    the ops `policy` names, PREFER_RECOMPUTE everything else."""
    keep = aten_ops(policy)

    def policy_fn(ctx, op, *args, **kwargs):
        packet = getattr(op, "overloadpacket", op)
        return CheckpointPolicy.MUST_SAVE if packet in keep else CheckpointPolicy.PREFER_RECOMPUTE

    return policy_fn


def context_fn(policy):
    """`context_fn` for torch.utils.checkpoint.checkpoint(use_reentrant=False) that keeps the
    outputs of the ops `policy` names and recomputes the rest."""
    return functools.partial(create_selective_checkpoint_contexts, sac_policy(policy))


def contexts(policy, ledger=None) -> tuple:
    """(forward, recompute) contexts of one selective checkpoint; with a TorchLedger, what the
    cache keeps is counted in it until the recompute consumes it."""
    forward, recompute = create_selective_checkpoint_contexts(sac_policy(policy))
    return (forward if ledger is None else _counting(forward, ledger)), recompute


@contextlib.contextmanager
def _counting(caching_mode, ledger):
    with caching_mode:
        yield
    ledger.hold_cached(caching_mode.storage)  # complete: a forward only adds to the cache

