"""Checkers of labs/08_schedules_and_budgets.ipynb, one function per exercise.

The expected values come from ckptlab itself (the traffic models, the roofline, the float64
reference), never typed in, so an exercise follows the kernels if they change.
"""

from __future__ import annotations

from ckptlab.exercises.verdict import NOT_YET, Verdict, close, exact, right, unanswered, wrong
from ckptlab.measure import at_scale
from ckptlab.recompute import schedules


def _schedule(answer, L, prof):
    """(Schedule, None) from a spec string, a Schedule or a plan list; else (None, Verdict)."""
    try:
        if isinstance(answer, str):
            if answer.strip().startswith("optimal"):
                return None, wrong("optimal(...) is the DP's own answer: build a schedule "
                                    "yourself (a spec like every(2), or a plan list)")
            return schedules.make(answer, L, prof), None
        if isinstance(answer, schedules.Schedule):
            if answer.name.startswith("optimal"):
                return None, wrong("that is the DP's own answer: build a schedule yourself")
            return answer, None
        if isinstance(answer, list):
            return schedules.Schedule("yours", answer), None
    except (TypeError, ValueError) as e:
        return None, wrong(f"the schedule cannot be built: {e}")
    return None, wrong(f"give a spec string, a Schedule or a plan list; you gave "
                        f"{type(answer).__name__}")


def schedule_for_budget(answer, prof, fraction: float = 0.4) -> Verdict:
    """A schedule (spec, Schedule or plan; not optimal(...)) whose predicted peak of saved
    bytes fits `fraction` of the no-checkpointing peak and which recomputes fewer FLOPs than
    the sqrt schedule."""
    if unanswered(answer):
        return Verdict(NOT_YET)
    L = prof.n_blocks
    budget = fraction * schedules.none(L).predict(prof).peak_bytes
    sqrt = schedules.sqrt(L).predict(prof)
    sched, bad = _schedule(answer, L, prof)
    if bad:
        return bad
    try:
        pred = sched.predict(prof)
    except (TypeError, ValueError) as e:
        return wrong(f"the schedule cannot be run on this chain: {e}")
    if pred.peak_bytes > budget:
        return wrong(f"its peak is {pred.peak_bytes:,} bytes, over the budget of {budget:,.0f}")
    if pred.recompute_flops >= sqrt.recompute_flops:
        return wrong(f"it fits, but recomputes {pred.recompute_flops:,} FLOPs, no fewer than "
                      f"sqrt's {sqrt.recompute_flops:,}: keep the last blocks' activations "
                      "(freed first in the backward) and checkpoint the rest")
    return right()


def korthikanti_bytes(answer, s: int, b: int, h: int, a: int) -> Verdict:
    """Bytes of activations one transformer layer holds for its backward with no recompute
    (Korthikanti et al. 2022, 16-bit): sequence s, micro-batch b, hidden h, a heads."""
    want = at_scale.layer_activation_bytes(s, b, h, a, "none")
    return exact(answer, want, "the byte count", hints=[
        (at_scale.layer_activation_bytes(s, b, h, a, "selective"),
         "that leaves out the attention core's 5 a s^2 b bytes (the softmax output, the "
         "dropout mask and the dropout output)"),
    ], hint="s b h (34 + 5 a s / h)")


def selective_saving(answer, s: int, b: int, h: int, a: int) -> Verdict:
    """The fraction of one layer's activation bytes that selective recompute (of the attention
    core) saves against none: 1 - selective / none."""
    want = 1 - (at_scale.layer_activation_bytes(s, b, h, a, "selective")
                / at_scale.layer_activation_bytes(s, b, h, a, "none"))
    return close(answer, want, "the fraction", 0.01, hints=[
        (100 * want, "a fraction, not a percentage"),
    ], hint="the saved part is 5 a s / h out of 34 + 5 a s / h")
