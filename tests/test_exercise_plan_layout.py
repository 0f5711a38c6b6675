"""The checker of "choose t and p for a given model and cluster": right for a fastest layout by
ckptlab's model, wrong with the reason (never the answer) for a layout that is not one, does
not fit, or is slower, and for malformed answers; never raises."""

import re

import pytest

from ckptlab.cli import plan
from ckptlab.cluster import planner
from ckptlab.exercises import plan_layout

GPT3 = plan.MODELS["gpt3-175b"]
CLUSTER = dict(model=GPT3, gpus=128, gpu="a100", memory_gib=80, batch=128)


def test_the_fastest_layout_is_right():
    chosen, _ = planner.plan(GPT3, 128, "a100", 80 * 2**30, 128)
    t, p = chosen.layout.tp, chosen.layout.pp
    assert plan_layout.choose_layout((t, p), **CLUSTER) == "right"
    assert plan_layout.choose_layout([t, p], **CLUSTER) == "right"
    assert plan_layout.choose_layout({"t": t, "p": p}, **CLUSTER) == "right"


@pytest.mark.parametrize("answer,reason", [
    ((8, 8), "fits, but its best step is"),
    ((4, 2), "does not fit 80 GiB even recomputing every layer"),
    ((16, 1), "more than the 8 GPUs of a node"),
    ((3, 1), "not a power of two"),
    ((8, 32), "t x p = 256 does not divide the 128 GPUs"),
    ((8, 5), "t x p = 40 does not divide"),
])
def test_wrong_layouts_get_the_reason_not_the_answer(answer, reason):
    verdict = plan_layout.choose_layout(answer, **CLUSTER)
    assert verdict.startswith("wrong, because") and reason in verdict
    chosen, _ = planner.plan(GPT3, 128, "a100", 80 * 2**30, 128)
    assert f"t = {chosen.layout.tp}, p = {chosen.layout.pp} " not in verdict.replace(
        f"t = {answer[0]}, p = {answer[1]} ", "")


def test_layers_and_heads_a_layout_cannot_split():
    gpt2 = plan.MODELS["gpt2-small"]  # 12 layers, 12 heads
    kw = dict(model=gpt2, gpus=8, gpu="a100", memory_gib=80, batch=64)
    assert "does not divide the 12 heads" in plan_layout.choose_layout((8, 1), **kw)
    assert "does not divide the 12 layers" in plan_layout.choose_layout((1, 8), **kw)
    assert "d = 8 does not divide the batch of 3" in plan_layout.choose_layout(
        (1, 1), **dict(kw, batch=3))


def test_a_cluster_where_nothing_fits():
    verdict = plan_layout.choose_layout((8, 1), GPT3, 8, "a100", 80, 8)
    assert verdict.startswith("wrong") and "no layout fits" in verdict


@pytest.mark.parametrize("answer", ["8,1", (8,), (8, 1, 1), (8, "1"), (8.0, 1), (True, 1),
                                    (0, 1), (-8, 1), 8, {"t": 8}])
def test_malformed_answers_are_wrong_with_the_reason(answer):
    verdict = plan_layout.choose_layout(answer, **CLUSTER)
    assert verdict.startswith("wrong, because the answer is a pair (t, p) of positive ints")


@pytest.mark.parametrize("answer", [None, ...])
def test_unanswered(answer):
    assert plan_layout.choose_layout(answer, **CLUSTER) == "not answered yet"


def test_a_layout_only_pruned_is_never_said_not_to_fit():
    """A (t, p) whose every micro-batch the planner pruned unevaluated (its matmuls alone slower
    than the runner-up's step) is not said to miss the memory: at t = 1, p = 32 on 80 GiB the
    peak with every layer recomputed is well under 80 GiB. Every "does not fit M GiB ... X GiB"
    verdict of the grid has X > M."""
    pruned = plan_layout.choose_layout((1, 32), **CLUSTER)
    assert pruned.startswith("wrong, because") and "does not fit" not in pruned
    assert "matmuls alone" in pruned
    for t in (1, 2, 4, 8):
        for p in (1, 2, 4, 8, 16, 32):
            verdict = plan_layout.choose_layout((t, p), **CLUSTER)
            m = re.search(r"does not fit (\d+) GiB even recomputing every layer: (\d+) GiB",
                          verdict)
            if m:
                assert int(m.group(2)) > int(m.group(1)), verdict
