"""Which ops recompute their insides: a schedule's recompute_ops (recompute(attn), Korthikanti
et al.'s selective recompute) on torch modules, and the contexts every checkpoint runs under.

    with recomputing({"attention"}):       # what Schedule.recompute_ops says
        a = recomputed("attention", attend, q, k, v)   # a checkpoint keeping q, k, v only

A module calls recomputed(name, fn, ...) around an op's insides; when the name is in force
that is a torch.utils.checkpoint(use_reentrant=False) of its own. A checkpoint's recompute
re-enters the recompute_ops its first pass ran under (as ckptlab's engine does), and, under a
TorchLedger, the ledger's recompute hooks (ledger.py), so that what it holds is counted.
"""

from __future__ import annotations

import contextlib

from torch.utils.checkpoint import checkpoint

from ckptlab.engine.tape import RECOMPUTABLE
from ckptlab.torch import ledger as ledgers

_ops = [frozenset()]  # the recompute_ops in force, innermost last


@contextlib.contextmanager
def recomputing(ops):
    """Inside: the ops named (ckptlab's names: "attention") recompute their insides."""
    ops = frozenset(ops)
    if ops - RECOMPUTABLE:
        raise ValueError(f"recomputing: {sorted(ops - RECOMPUTABLE)} cannot recompute their "
                         f"insides; expected names from {sorted(RECOMPUTABLE)}")
    _ops.append(ops)
    try:
        yield ops
    finally:
        _ops.pop()


def recompute_ops() -> frozenset:
    """The op names that recompute their insides now."""
    return _ops[-1]


def recomputed(name: str, fn, *args):
    """fn(*args), an op's insides; if `name` is among recompute_ops(), as a checkpoint that
    keeps only the tensors in args and redoes fn in the backward."""
    if name not in recompute_ops():
        return fn(*args)
    return checkpoint(fn, *args, use_reentrant=False, context_fn=contexts(ledgers.current()))


def contexts(ledger, ops=frozenset(), forward=None, cached=None):
    """context_fn of one checkpoint call: (the forward's context, the recompute's). The
    recompute runs under `cached` (a selective checkpoint's cached mode), the ledger's recompute
    hooks with the ledger current again, and `ops`, the recompute_ops of the first pass."""
    def context_fn():
        first = forward if forward is not None else contextlib.nullcontext()
        return first, _recompute(cached, ledger, ops)
    return context_fn


@contextlib.contextmanager
def _recompute(cached, ledger, ops):
    with contextlib.ExitStack() as stack:
        if cached is not None:
            stack.enter_context(cached)
        if ledger is not None:
            stack.enter_context(ledger.recompute_hooks())
            stack.enter_context(ledger.as_current())
        stack.enter_context(recomputing(ops))
        yield
