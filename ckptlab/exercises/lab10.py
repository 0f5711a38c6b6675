"""Checkers of labs/10_schedules_and_budgets.ipynb, one function per exercise.

The expected values come from ckptlab itself (the traffic models, the roofline, the float64
reference), never typed in, so an exercise follows the kernels if they change.
"""

from __future__ import annotations

from ckptlab.exercises.verdict import NOT_YET, Verdict, exact, right, unanswered, wrong
from ckptlab.recompute import schedules
from ckptlab.recompute.optimal import revolve_cost


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


def revolve_one_snapshot(answer, l: int) -> Verdict:
    """Block forwards recomputed to reverse a chain of l blocks with one snapshot (only the
    chain's input kept): Revolve's cost with s = 1, i.e. l (l - 1) / 2."""
    return exact(answer, revolve_cost(l, 1), "the number of block forwards", hints=[
        (l * l, "that counts the whole chain for every block: block k needs only the k blocks "
                "before it run again"),
        (l * (l + 1) // 2, "that counts each block's own forward too: to reverse block k you "
                           "rerun the k blocks before it, 0 for the first"),
    ], hint="to reverse block k, rerun blocks 0 .. k-1 from the input")
