"""Lab 14's "What it means" quotes the planner's numbers in its prose; each is recomputed here
from the model, formatted as the text prints it, and must appear in the text (a change to the
step model that moves one fails here until the sentence says what the model now says)."""

import pathlib

import pytest

from ckptlab.cli import plan
from ckptlab.cluster import plan_compare, planner, step_time

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (requirements-dev)")

GIB = 2**30
LAB = pathlib.Path(__file__).parent.parent / "labs" / "14_plan_a_run.ipynb"


@pytest.fixture(scope="module")
def text():
    cells = nbformat.read(LAB, as_version=4).cells
    return " ".join(c.source for c in cells if c.cell_type == "markdown"
                    and "## 5. What it means" in c.source).replace("\n", " ")


def test_the_gpt3_plan_and_its_runner_up(text):
    model = plan.MODELS["gpt3-175b"]
    chosen, rows = plan.plan(model, 1024, "a100", 80 * GIB, batch=1536)
    lay = chosen.layout
    assert (lay.tp, lay.sp, lay.dp, lay.zero, lay.pp, lay.micro_batch) == (4, True, 256, 3, 1, 2)
    assert "t = 4 with sequence parallelism and FSDP over d = 256, micro-batches of 2" in text
    mfu = step_time.model_flops(model, 1536) / chosen.step_s / 1024 / 312e12
    assert f"{chosen.peak / GIB:.1f} GiB a GPU and a modeled {chosen.step_s:.1f} s step " \
           f"(MFU {mfu:.1%})" in text
    second = plan_compare.runner_up(chosen, rows)
    lay2 = second.layout
    assert (lay2.tp, lay2.sp, lay2.pp, lay2.zero) == (4, False, 1, 3)
    assert f"is {second.step_s / chosen.step_s - 1:.1%} slower" in text
    d = {k: second.time.terms[k] - chosen.time.terms[k] for k in chosen.time.terms}
    assert f"cannot hide (-{-d['dp_exposed']:.2f} s)" in text
    assert f"sequence parallelism splits (+{d['elementwise_f'] + d['elementwise_b']:.2f} s)" \
        in text
    # the tie: the layouts within the model's demonstrated error of the plan
    close = plan_compare.within_error(chosen, rows)
    assert f"is {plan_compare.MODEL_ERROR:.1%} (the median" in text
    words = ["no", "one", "two", "three", "four", "five", "six", "seven", "eight"]
    assert f"and {words[len(close)]} layouts lie within it" in text
    # FlashAttention's share of the step against standard attention on the same layout
    std = step_time.step_time(plan.padded(model, lay.tp), lay, "a100", "bf16", "none", 0,
                              chosen.micro_batches, "torch")
    fa = chosen.time.terms["attention_f"] + chosen.time.terms["attention_b"]
    sa = std.terms["attention_f"] + std.terms["attention_b"]
    assert f"{fa:.2f} s of the {chosen.step_s:.1f} s step, against {sa:.2f} s for standard " \
           "attention" in text


def test_megatron_recipe_and_its_example_script(text):
    model = plan.MODELS["gpt3-175b"]
    kw = dict(batch=1536, recipe="bf16-fp32grad", loss="fused")
    chosen, _ = plan.plan(model, 1024, "a100", 80 * GIB, **kw)
    lay = chosen.layout
    assert (lay.tp, lay.pp, lay.vp, lay.dp, lay.zero) == (4, 8, 4, 32, 1)
    assert f"with the distributed optimizer, {chosen.step_s:.1f} s." in text
    _, script = plan._compare("8,16", model, 1024, "a100", 80 * GIB, 1536, None,
                              "bf16-fp32grad", "fused", None)
    assert (script.layout.tp, script.layout.pp) == (8, 16)
    pct = f"{script.step_s / chosen.step_s - 1:.1%}"
    assert f"is by the model {pct} slower" in text


def test_gpt2_on_one_card(text):
    model = plan.MODELS["gpt2-small"]
    chosen, _ = plan.plan(model, 1, "4090", 24 * GIB, micro_batch=16)
    assert chosen.base == "flash"
    sel = planner.evaluate(model, chosen.layout, 1, "4090", 24 * GIB, base="selective")
    fused = planner.evaluate(model, chosen.layout, 1, "4090", 24 * GIB, loss="fused",
                             base="flash")
    assert f"fits at {chosen.peak / GIB:.1f} GiB and is the fastest choice " \
           f"({chosen.step_s * 1e3:.0f} ms modeled, against {sel.step_s * 1e3:.0f} ms for " \
           "Korthikanti's selective recompute)" in text
    assert f"a fused loss would free {(chosen.peak - fused.peak) / GIB:.1f} GiB more" in text
