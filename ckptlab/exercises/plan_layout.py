"""Checker of the exercise "choose t and p for a given model and cluster" (lab 14).

The learner names a tensor-parallel size t and a pipeline size p for a GPT on N GPUs of M GiB
with a global batch; data parallelism takes the rest (d = N / (t p)). The expected answer comes
from ckptlab itself (ckptlab.cluster.planner: every layout, its best micro-batch, sharding and
recompute, by modeled step time), never typed in. Right: a (t, p) whose best step is within
TOLERANCE of the fastest layout's: the model's demonstrated error, inside which layouts tie.
Wrong: the reason (not a layout, does not fit, or fits but slower, and on what), never the
answer.
"""

from __future__ import annotations

import functools

from ckptlab.cluster import plan_compare, planner, step_time
from ckptlab.cluster import step_memory as sm
from ckptlab.exercises.verdict import NOT_YET, Verdict, right, unanswered, wrong

# within the model's demonstrated error of the fastest layout's modeled step counts as right (the
# median |error| on bench plan-check's held-out runs: the model cannot order layouts closer)
TOLERANCE = plan_compare.MODEL_ERROR


@functools.lru_cache(maxsize=16)
def _plan(model: sm.GPTShape, gpus: int, gpu: str, memory: float, batch: int):
    return planner.plan(model, gpus, gpu, memory, batch)


def _pair(answer):
    """(t, p) from a pair of ints, or None."""
    if isinstance(answer, dict):
        answer = (answer.get("t"), answer.get("p"))
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return None
    t, p = answer
    ok = all(isinstance(x, int) and not isinstance(x, bool) for x in (t, p))
    return (t, p) if ok and t >= 1 and p >= 1 else None


def _not_a_layout(model, gpus, gpu, t, p) -> str | None:
    node = step_time.links(gpu)[0]
    if t & (t - 1):
        return f"t = {t} is not a power of two: the planner splits a node's GPUs evenly"
    if t > node:
        return (f"t = {t} is more than the {node} GPUs of a node: tensor parallelism talks "
                "four times a layer, too often for InfiniBand")
    if model.heads % t or model.hidden % t:
        return f"t = {t} does not divide the {model.heads} heads: each GPU needs whole heads"
    if gpus % (t * p):
        return f"t x p = {t * p} does not divide the {gpus} GPUs"
    if model.layers % p:
        return f"p = {p} does not divide the {model.layers} layers: stages get whole layers"
    return None


def choose_layout(answer, model: sm.GPTShape, gpus: int, gpu: str, memory_gib: float,
                  batch: int) -> Verdict:
    """Is (t, p) a fastest layout of `model` on `gpus` GPUs of `memory_gib` GiB for `batch`
    sequences a step, by ckptlab's model?"""
    if unanswered(answer):
        return Verdict(NOT_YET)
    pair = _pair(answer)
    if pair is None:
        return wrong(f"the answer is a pair (t, p) of positive ints; you gave "
                     f"{type(answer).__name__} {answer!r}")
    t, p = pair
    why = _not_a_layout(model, gpus, gpu, t, p)
    if why:
        return wrong(why)
    chosen, rows = _plan(model, gpus, gpu, memory_gib * 2**30, batch)
    if chosen is None:
        return wrong("no layout fits this cluster at all: check the memory and the batch you "
                     "were given")
    mine = [(lay, o) for lay, o in rows if (lay.tp, lay.pp) == (t, p)]
    fits = [o for _, o in mine if isinstance(o, planner.Option)]
    if not fits:
        reasons = [o for _, o in mine if isinstance(o, str)]
        if reasons and all(r.startswith("batch") for r in reasons):
            return wrong(f"with t = {t}, p = {p} the data-parallel size d = {gpus // (t * p)} "
                         f"does not divide the batch of {batch}")
        least = min((sm.step_memory(planner.padded(model, t), lay, "bf16", "full",
                                    micro_batches=max(1, batch // (lay.dp * lay.micro_batch)))
                     for lay, o in mine if isinstance(o, str) and o.startswith("needs")),
                    key=lambda m: m.peak, default=None)
        if least is None:  # every micro-batch pruned unevaluated: its memory is not known
            return wrong(f"t = {t}, p = {p} cannot be the fastest, whether it fits or not: its "
                         "matmuls alone take longer than the fastest layouts' whole step. Which "
                         "of t or p leaves the GPUs idle?")
        term = max(least.terms, key=least.terms.get)
        return wrong(f"t = {t}, p = {p} does not fit {memory_gib:g} GiB even recomputing every "
                     f"layer: {least.peak / 2**30:.0f} GiB, most of it {term}. Which of t, p "
                     "(or ZeRO) divides that term?")
    best = min(fits, key=lambda o: o.step_s)
    if best.step_s <= chosen.step_s * (1 + TOLERANCE):
        return right()
    loses = plan_compare.difference(chosen, best)[0][0]
    return wrong(f"t = {t}, p = {p} fits, but its best step is "
                 f"{best.step_s / chosen.step_s - 1:.0%} slower than the fastest layout's; it "
                 f"loses most on {loses}. Which change of t or p shrinks that?")
