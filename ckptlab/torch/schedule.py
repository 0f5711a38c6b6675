"""Any ckptlab plan on a chain of torch modules, with torch.utils.checkpoint(use_reentrant=False).

    y = checkpoint_sequential(blocks, x, schedule="optimal(40%)")

A plan (ckptlab.recompute.plan) lists block indices, run plainly, and Segs, each one
torch.utils.checkpoint call over its items; a Seg inside a Seg (Revolve's plans) is a checkpoint
inside the recomputed function, which non-reentrant checkpointing supports. A Seg with a policy
(keep(matmul)) runs under the policy's PyTorch selective-checkpoint contexts (selective.py). A
schedule's recompute_ops (recompute(attn): Korthikanti et al.'s selective recompute) make the
ops so named keep only their inputs (recomputing.py). Under a TorchLedger every checkpoint also
gets the ledger's recompute hooks, so that the bytes a recompute holds are counted.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from ckptlab.recompute import schedules
from ckptlab.recompute.plan import Seg, check_plan, pytorch_sequential_plan
from ckptlab.torch import ledger as ledgers
from ckptlab.torch import selective
from ckptlab.torch.profile import profile as measure_profile
from ckptlab.torch.recomputing import contexts, recompute_ops, recomputing

BUDGETED = ("optimal", "chen_greedy")  # specs that need a profile


def _contexts(policy, ledger):
    """context_fn of one segment's checkpoint: SAC for a policy, the ledger's hooks, and the
    recompute_ops in force now for the recompute (recomputing.contexts)."""
    forward = cached = None
    if policy is not None:
        forward, cached = selective.contexts(policy, ledger)
    return contexts(ledger, recompute_ops(), forward, cached)


def run_plan(modules, plan, x, *, preserve_rng_state: bool = True,
             determinism_check: str = "default", ledger=None, use_reentrant: bool = False):
    """Run modules[0], modules[1], ... on x as `plan` says. `ledger`: the TorchLedger that
    counts recomputes (default: the one entered with `with`, if any). use_reentrant=True
    (PyTorch's older checkpoint) takes no context_fn: no policies, recompute_ops or ledger
    hooks, and its determinism_check is PyTorch's to ignore."""
    ledger = ledger if ledger is not None else ledgers.current()
    for item in plan:
        if isinstance(item, Seg):
            def segment(t, seg=item):
                return run_plan(modules, seg.items, t, preserve_rng_state=preserve_rng_state,
                                determinism_check=determinism_check, ledger=ledger,
                                use_reentrant=use_reentrant)
            if use_reentrant:
                if item.policy is not None or recompute_ops() or ledger is not None:
                    raise ValueError("use_reentrant=True checkpoints take no context_fn: "
                                     "selective policies, recompute_ops and a TorchLedger "
                                     "need use_reentrant=False")
                x = checkpoint(segment, x, use_reentrant=True,
                               preserve_rng_state=preserve_rng_state)
            else:
                x = checkpoint(segment, x, use_reentrant=False,
                               preserve_rng_state=preserve_rng_state,
                               determinism_check=determinism_check,
                               context_fn=_contexts(item.policy, ledger))
        else:
            x = modules[item](x)
    return x


def make_schedule(schedule, n: int, prof=None) -> schedules.Schedule:
    """A Schedule over n blocks from a spec ("sqrt", "optimal(40%)", ...), a Schedule or a
    plan list. optimal and chen_greedy need a profile (ckptlab.torch.profile)."""
    if isinstance(schedule, schedules.Schedule):
        sched = schedule
    elif isinstance(schedule, str):
        sched = schedules.make(schedule, n, prof)
    elif isinstance(schedule, (list, tuple)):
        sched = schedules.Schedule("plan", list(schedule))
    else:
        raise TypeError(f"schedule: expected a spec string, a Schedule or a plan list, got "
                        f"{type(schedule).__name__}")
    check_plan(sched.plan, n)
    return sched


def checkpoint_sequential(modules, x, schedule="sqrt", *, profile=None,
                          preserve_rng_state: bool = True, determinism_check: str = "default",
                          use_reentrant: bool | None = None):
    """Run the chain `modules` on x under a ckptlab schedule. A budgeted spec (optimal(...),
    chen_greedy(...)) without `profile` profiles the chain first on x (one forward and
    backward per module, gradients not accumulated): pass a profile to plan once.

    PyTorch's call works too, checkpoint_sequential(functions, segments, input,
    use_reentrant=..., preserve_rng_state=...), an int where x goes: it runs the plan PyTorch
    runs (ckptlab.recompute.plan.pytorch_sequential_plan: segments - 1 checkpointed chunks of
    len // segments modules, the rest plain), so it computes what PyTorch's computes. There,
    use_reentrant=None means False (PyTorch warns and takes True); ckptlab's own call always
    runs non-reentrant checkpoints (nested plans need them) and refuses use_reentrant=True."""
    modules = list(modules)
    if isinstance(x, int) and not isinstance(x, bool):  # PyTorch's (functions, segments, input)
        plan = pytorch_sequential_plan(len(modules), x)
        return run_plan(modules, plan, schedule, preserve_rng_state=preserve_rng_state,
                        determinism_check=determinism_check,
                        use_reentrant=bool(use_reentrant))
    if isinstance(schedule, torch.Tensor) and not isinstance(x, torch.Tensor):
        # PyTorch's call with a segments that is not an int: name it, not the schedule
        raise TypeError(f"segments must be an int (PyTorch's call, checkpoint_sequential("
                        f"functions, segments, input)), got {type(x).__name__} {x!r}")
    if use_reentrant:
        raise ValueError("use_reentrant=True: ckptlab's schedules run non-reentrant checkpoints "
                         "(nested plans, policies and ledgers need them); it is accepted only "
                         "with PyTorch's call, checkpoint_sequential(functions, segments, input)")
    if profile is None and isinstance(schedule, str) and schedule.strip().startswith(BUDGETED):
        profile = measure_profile(modules, x)
    sched = make_schedule(schedule, len(modules), profile)
    with recomputing(sched.recompute_ops):
        return run_plan(modules, sched.plan, x, preserve_rng_state=preserve_rng_state,
                        determinism_check=determinism_check)
