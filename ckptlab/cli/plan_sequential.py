"""`python -m ckptlab plan --sequential MODULE:FACTORY --input-shape B,D`: the same question for
any torch.nn.Sequential, measured rather than written: FACTORY() builds the chain, it runs once
on a random input of that shape (the micro-batch of one GPU) and ckptlab.torch.profile records
what each module saves and computes. The GPUs hold it data-parallel (no tensor parallelism: a
chain of arbitrary modules has no known split) under ZeRO stage 0-3; for each stage the model
states come from the parameter count and the recipe (ckptlab.cluster.step_memory), ZeRO-3 adds
its largest module gathered twice over and its unsharded gradients, and what is left of the
GPU's memory is the budget of ckptlab's optimal schedule over the modules (whole modules
kept or recomputed, nested as the DP finds best). Activations are measured in the chain's own
dtype on this machine's CPU.
"""

from __future__ import annotations

import importlib
import math

from ckptlab.cli.report import UsageError, check_bytes
from ckptlab.cluster import step_memory as sm
from ckptlab.measure import roofline
from ckptlab.recompute import schedules

GIB = 1024**3


def load(spec: str, shape: str):
    """(modules, input) from "pkg.module:factory" and "B,D,..."."""
    try:
        import torch
    except ImportError:
        raise UsageError("--sequential needs PyTorch (pip install -e '.[torch]')") from None
    try:
        dims = [int(v) for v in shape.split(",")]
    except ValueError:
        dims = []
    if not dims or min(dims) < 1:
        raise UsageError(f"--input-shape: expected positive ints separated by commas, got "
                         f"{shape!r}")
    check_bytes(4 * math.prod(dims), f"--input-shape {shape} (fp32)", "emu",
                hint="choose a smaller input")
    mod, _, name = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise UsageError(f"--sequential {spec}: cannot load it ({e})") from None
    if not callable(factory):
        raise UsageError(f"--sequential {spec}: {name!r} is a {type(factory).__name__}, not a "
                         "function that builds the chain")
    try:
        chain = factory()
    except Exception as e:  # the user's code: its failure is the message, not a traceback
        raise UsageError(f"--sequential {spec}: {name}() raised {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")) from None
    if not isinstance(chain, torch.nn.Sequential) or len(chain) < 1:
        raise UsageError(f"--sequential {spec}: expected a non-empty torch.nn.Sequential, got "
                         f"{type(chain).__name__}")
    return list(chain), torch.randn(*dims, generator=torch.Generator().manual_seed(0))


def plan(modules, x, gpus: int, gpu: str, memory: float, recipe: str = "fp32",
         micro_batches: int = 1) -> list:
    """Rows per ZeRO stage: the schedule with the least recompute that fits, or why none."""
    from ckptlab.torch.profile import profile

    prof = profile(modules, x)
    L = len(modules)
    psi = sum(p.numel() for m in modules for p in m.parameters())
    unit = max(sum(p.numel() for p in m.parameters()) for m in modules)
    rec = sm.RECIPES[recipe]
    none = schedules.none(L).predict(prof)
    rows = []
    for zero in (range(4) if gpus > 1 else (0,)):
        states = sm.model_states(psi, recipe, gpus, zero)
        transient = unit * (2 * rec.param + rec.grad) if zero == 3 else 0
        budget = memory - sum(states.values()) - transient
        row = dict(zero=zero, states=states, transient=transient, budget=budget)
        if budget < 0:
            row["why"] = (f"the model states alone need {(memory - budget) / GIB:.3g} GiB")
            rows.append(row)
            continue
        if none.peak_bytes <= budget:
            sched, pred = schedules.none(L), none
        else:
            try:
                sched = schedules.optimal(budget, prof)
            except ValueError as e:
                row["why"] = (f"{max(budget, 0) / GIB:.3g} GiB left after the model states; "
                              f"{str(e).replace('optimal: ', '')}")
                rows.append(row)
                continue
            pred = sched.predict(prof)
        dtype = "fp32" if recipe == "fp32" else "bf16"
        flops = micro_batches * pred.hardware_flops
        row.update(plan=str(sched.plan), activations=pred.peak_bytes,
                   recompute=micro_batches * pred.recompute_flops,
                   peak=sum(states.values()) + transient + pred.peak_bytes,
                   step_s=flops / roofline.peak_flops(gpu, dtype))
        rows.append(row)
    return rows


def report(rows, gpus, gpu, memory) -> str:
    lines = [f"plan: a torch.nn.Sequential data-parallel on {gpus} x "
             f"{roofline.spec(gpu)['name']} with {memory / GIB:.3g} GiB each (model states "
             "modeled, activations measured on this CPU, step time at peak)",
             f"{'ZeRO':>4}  {'plan over the modules':<40} {'peak GiB':>9} {'recompute':>12} "
             f"{'step s':>9}"]
    fits = [r for r in rows if "plan" in r]
    for r in sorted(fits, key=lambda r: (r["recompute"], r["step_s"])):
        lines.append(f"{r['zero']:>4}  {r['plan'][:40]:<40} {r['peak'] / GIB:>9.3g} "
                     f"{r['recompute']:>12.3g} {r['step_s']:>9.3g}")
    for r in rows:
        if "why" in r:
            lines.append(f"{r['zero']:>4}  does not fit: {r['why']}")
    if fits:
        best = min(fits, key=lambda r: (r["recompute"], r["step_s"]))
        lines.insert(1, f"chosen: ZeRO-{best['zero']}, plan {best['plan']}")
    else:
        lines.insert(1, "NOTHING FITS")
    return "\n".join(lines)
