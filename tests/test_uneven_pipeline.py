"""Pipelines whose stages do not divide the layers: torchtitan's split (the embedding and the
head weighing a layer each) and Megatron's first / last stage sizes, in the step models (the
heaviest stage sets the peak, the slowest the pace) and the planner, with the torch pipeline
splitting the same way."""

import pytest

from ckptlab.cluster import pipeline, planner, step_time
from ckptlab.cluster import step_memory as sm
from ckptlab.cluster.llama_layer import LlamaShape

GIB = 2**30


def test_splits_as_the_frameworks_do():
    assert pipeline.split_layers(126, 16) == [7] + [8] * 14 + [7]  # Meta's Llama 3 405B
    assert pipeline.split_layers(70, 12) == [5] + [6] * 10 + [5]
    assert pipeline.split_layers(96, 8) == [12] * 8  # divides: evenly, as before
    # torchtitan's generate_llm_fqn_per_model_part: 7 units over 3 stages, the first one more
    assert pipeline.split_layers(5, 3) == [2, 2, 1]
    assert pipeline.split_layers(80, 6, first=12, last=12) == [12] + [14] * 4 + [12]
    assert pipeline.split_layers(80, 6, first=10) == [10] + [14] * 5


def test_the_torch_pipeline_splits_the_same_way():
    pytest.importorskip("torch", reason="PyTorch is not installed: pip install -e '.[torch]'")
    from ckptlab.torch import pipeline as torch_pipeline

    for layers, p in ((126, 16), (70, 12), (5, 3), (31, 4)):
        assert [len(r) for r in torch_pipeline.split_layers(layers, p)] == \
            pipeline.split_layers(layers, p)


@pytest.mark.parametrize("call,msg", [
    (lambda: pipeline.split_layers(2, 3), "2 layers cannot fill 3 stages"),
    (lambda: pipeline.split_layers(80, 6, first=11), "must split evenly over the other 5"),
    (lambda: pipeline.split_layers(80, 1, first=11), "need a pipeline"),
    (lambda: pipeline.split_layers(80, 2, first=11, last=11), "must be the 80 layers at p = 2"),
    (lambda: pipeline.split_layers(80, 4, first=0), "first stage's layers: expected"),
])
def test_bad_splits_are_one_line(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


MODEL = LlamaShape(30, 512, 8, 2, 1536, 1024, 32000)  # over 4 stages: 7, 8, 8, 7 layers


def every_stage(layout, **kw):
    return [sm.step_memory(MODEL, layout, stage=i, **kw) for i in range(layout.pp)]


def test_the_heaviest_stage_sets_the_peak():
    """Stage 1 holds 8 layers for 3 micro-batches, stage 0 7 for 4: the peak is the largest of
    all four stages, whichever it is, computed one by one."""
    lay = sm.Layout(pp=4, micro_batch=2)
    assert pipeline.split_layers(30, 4) == [7, 8, 8, 7]
    for recompute in ("none", "selective", "full"):
        stages = every_stage(lay, recompute=recompute, micro_batches=8)
        worst = sm.step_memory(MODEL, lay, recompute=recompute, micro_batches=8)
        assert worst.peak == max(x.peak for x in stages)
    assert sm.step_memory(MODEL, lay, stage=1).terms["params"] == \
        2 * 8 * MODEL.layer_params()


def test_a_middle_stage_with_more_layers_is_compared():
    """22 layers over 4: 5, 6, 6, 5; stage 1 (6 layers, 3 micro-batches) against stage 0 (5
    layers, 4 micro-batches, the embedding): the model looks at both."""
    m = LlamaShape(22, 512, 8, 2, 1536, 1024, 32000)
    assert pipeline.split_layers(22, 4) == [5, 6, 6, 5]
    assert pipeline.distinct_stages(22, 4) == [0, 1, 3]
    lay = sm.Layout(pp=4)
    worst = sm.step_memory(m, lay, micro_batches=8)
    assert worst.peak == max(sm.step_memory(m, lay, stage=i, micro_batches=8).peak
                             for i in range(4))
    assert set(worst.stages) == {0, 1, 3}


def test_the_slowest_stage_sets_the_pace():
    m = LlamaShape(22, 512, 8, 2, 1536, 1024, 32000)
    lay = sm.Layout(pp=4)
    st = step_time.step_time(m, lay, "h100", micro_batches=8)
    rec = sm.recipe_of("bf16")
    totals = [sum(step_time.stage_parts(m, lay, "h100", rec, "none", 0, "torch", i,
                                        step_time.efficiency(m, lay, "h100"), False).values())
              for i in range(4)]
    assert st.micro_batch_s == pytest.approx(max(totals), rel=1e-12)
    assert st.stage == totals.index(max(totals))


def test_full_layers_cap_at_a_stage_s_own():
    """Every layer recomputed: each stage recomputes all it holds (7 or 8)."""
    lay = sm.Layout(pp=4)
    full = sm.step_memory(MODEL, lay, recompute="full", stage=3)
    k8 = sm.step_memory(MODEL, lay, recompute="none", full_layers=8, stage=3)
    assert full.peak == k8.peak


def test_the_planner_tries_stages_that_do_not_divide_the_layers():
    """70 layers on 64 GPUs: 4, 8 and 16 stages do not divide 70 and are tried, split unevenly,
    one chunk a stage."""
    m = LlamaShape(70, 1024, 16, 4, 2816, 2048, 32000)
    _, rows = planner.plan(m, 64, "h100", 80 * GIB, batch=64)
    ps = {lay.pp for lay, _ in rows}
    assert {4, 8} <= ps and all(lay.vp == 1 for lay, _ in rows if 70 % lay.pp)
