"""The planner's choices term by term: the memory a whole-layer recompute replaces, the
micro-batches tried, the pruning that must keep the runner-up, the runner-up of another family,
the recompute FLOPs of an interleaved layout, and the term why_faster names."""

import pytest

from ckptlab.cluster import efficiency, pipeline, plan_compare, planner, step_time, zero3
from ckptlab.cluster import step_memory as sm

GIB = 1024**3
SMALL = sm.GPTShape(8, 512, 8, 512, 4096)
TINY = sm.GPTShape(6, 256, 4, 256, 1000)


@pytest.mark.parametrize("layout", [sm.Layout(), sm.Layout(tp=2, sp=True), sm.Layout(pp=2),
                                    sm.Layout(pp=2, vp=2), sm.Layout(pp=4)])
def test_a_layer_recomputed_whole_is_charged_its_input_only(layout):
    """Selective (or FlashAttention's) recompute on top of every layer recomputed whole is the
    full recompute: a whole layer keeps only its input, whatever the base; and each layer more
    recomputed whole takes away one base layer and adds one input per micro-batch in flight."""
    n = planner.chunk_layers(SMALL.layers, layout)
    kw = dict(micro_batches=4, stage=0)
    full = sm.step_memory(SMALL, layout, recompute="full", **kw)
    for base in ("none", "flash", "selective"):
        every = sm.step_memory(SMALL, layout, recompute=base, full_layers=n, **kw)
        assert every.terms == full.terms, base
    one = SMALL.layer_activations(1, "selective", t=layout.tp, sp=layout.sp, bytes_per_value=2)
    inp = SMALL.layer_activations(1, "full", t=layout.tp, sp=layout.sp, bytes_per_value=2)
    flight = sum(sm.pipeline.in_flight(0, layout.pp, 4, layout.vp))
    acts = [sm.step_memory(SMALL, layout, recompute="selective", full_layers=k, **kw)
            .terms["activations"] for k in range(n)]
    steps = {b - a for a, b in zip(acts[1:-1], acts[2:], strict=True)}  # past k = 1
    assert steps <= {flight * (inp - one)}


def test_the_largest_micro_batch_is_tried():
    """One GPU, a batch of one: the only micro-batch is the batch itself."""
    chosen, rows = planner.plan(SMALL, 1, "a100", 40 * GIB, batch=1)
    assert chosen is not None and chosen.layout.micro_batch == 1
    _, rows = planner.plan(SMALL, 1, "a100", 40 * GIB, batch=32)
    tried = {lay.micro_batch for lay, _ in rows}
    assert tried == {1, 2, 4, 8, planner.MAX_MICRO_BATCH}


def _every_option(model, gpus, memory, batch):
    out = []
    for lay, m in planner.layouts(model, gpus, "a100", batch):
        if not isinstance(m, str):
            if lay.zero == 3:
                lay = planner.replace(lay, zero3="fsdp")
            opt = planner.best_option(model, lay, m, "a100", memory)
            if opt is not None:
                out.append((lay, opt))
    return out


@pytest.mark.parametrize("model,gpus,batch,memory", [(TINY, 32, 32, 40), (TINY, 16, 64, 8),
                                                     (SMALL, 16, 32, 8)])
def test_pruning_keeps_the_runner_up(model, gpus, batch, memory):
    """A layout is pruned only when its lower bound passes the second-best family's step: the
    plan and the runner-up are the ones evaluating every layout gives."""
    chosen, rows = planner.plan(model, gpus, "a100", memory * GIB, batch=batch)
    every = _every_option(model, gpus, memory * GIB, batch)
    best = min((o for _, o in every), key=lambda o: (o.step_s, o.peak))
    assert chosen.step_s == best.step_s
    ours, theirs = plan_compare.runner_up(chosen, rows), plan_compare.runner_up(best, every)
    assert ours is not None and ours.step_s == theirs.step_s


MID = sm.GPTShape(24, 2048, 16, 2048, 50257)


@pytest.mark.parametrize("model,gpus,batch,memory", [(MID, 8, 64, 40), (SMALL, 16, 32, 8)])
def test_the_runner_up_is_another_family(model, gpus, batch, memory):
    """The runner-up is the fastest option of another layout family (t, SP, p, d, ZeRO: what
    the report's table lists once), never the plan's own layout with another micro-batch or
    virtual stages."""
    chosen, rows = planner.plan(model, gpus, "a100", memory * GIB, batch=batch)
    second = plan_compare.runner_up(chosen, rows)
    assert planner.family(second.layout) != planner.family(chosen.layout)
    others = [o for _, o in rows if isinstance(o, planner.Option)
              and planner.family(o.layout) != planner.family(chosen.layout)]
    assert second.step_s == min(o.step_s for o in others)
    same = [o for _, o in rows if isinstance(o, planner.Option) and o is not chosen
            and planner.family(o.layout) == planner.family(chosen.layout)]
    assert same  # the plan's own family has other options
    if model is MID:  # and here one of them is the second fastest of all: the test can tell
        fastest = min((o for _, o in rows if isinstance(o, planner.Option) and o is not chosen),
                      key=lambda o: (o.step_s, o.peak))
        assert planner.family(fastest.layout) == planner.family(chosen.layout)


def test_recompute_flops_count_every_chunk():
    """Interleaved, v chunks a stage: `full` layers of each chunk recomputed whole are v full
    layers a stage; the rest run the base's recompute."""
    model = sm.GPTShape(16, 512, 8, 512, 4096)
    lay = sm.Layout(pp=2, vp=4, micro_batch=2)
    m, b = 4, 2
    for base in ("selective", "flash"):
        opt = planner.evaluate(model, lay, m, "a100", 80 * GIB, base=base, full=1)
        n = 8  # layers a stage
        want = m * (4 * model.layer_forward_flops(b) + (n - 4) * model.recompute_flops(b, base))
        assert opt.recompute_flops == want


def _option(terms):
    lay = sm.Layout()
    mem = sm.StepMemory({"params": 1}, {}, 0)
    return planner.Option(lay, "none", 0, 1, mem, step_time.StepTime(dict(terms)), 0.0)


def test_why_faster_names_what_the_slower_loses_and_gains():
    a = _option(dict(matmul_f=1.0, bubble=0.5, dp_exposed=0.2))
    b = _option(dict(matmul_f=1.0, bubble=1.5, dp_exposed=0.1))
    assert plan_compare.why_faster(a, b) == ("bubble +1 s, though data-parallel comm (exposed) "
                                             "-0.1 s")
    c = _option(dict(matmul_f=1.0, bubble=0.5, tp_f=0.3, dp_exposed=0.2))
    assert plan_compare.why_faster(a, c) == "tensor-parallel comm +0.3 s"  # nothing gained


def test_a_plan_that_fills_the_memory_exactly_fits():
    chosen, _ = planner.plan(SMALL, 4, "a100", 8 * GIB, batch=32)
    again, _ = planner.plan(SMALL, 4, "a100", chosen.peak, batch=32)
    assert again is not None and again.peak == chosen.peak <= again.peak


def test_every_layout_of_the_docstring_is_tried():
    """Sequence parallelism on and off when t > 1, every virtual-stage count up to MAX_VIRTUAL
    that divides L / p, ZeRO 0-3 without a pipeline and 0-1 with one."""
    model = sm.GPTShape(24, 512, 8, 512, 4096)
    tried = [lay for lay, m in planner.layouts(model, 16, "a100", 64) if not isinstance(m, str)]
    assert {lay.sp for lay in tried if lay.tp > 1} == {False, True}
    assert {lay.vp for lay in tried if lay.pp == 2} == set(range(1, planner.MAX_VIRTUAL + 1))
    assert {lay.zero for lay in tried if lay.pp == 1 and lay.dp > 1} == {0, 1, 2, 3}
    assert {lay.zero for lay in tried if lay.pp > 1 and lay.dp > 1} == {0, 1}


def test_the_families_tell_zero_stages_apart():
    assert planner.family(sm.Layout(dp=4, zero=1)) != planner.family(sm.Layout(dp=4, zero=3))
    assert planner.family(sm.Layout(dp=4, micro_batch=2, vp=1)) == \
        planner.family(sm.Layout(dp=4, micro_batch=8))


def test_why_not_names_the_largest_term():
    model = sm.GPTShape(32, 4096, 32, 2048, 50257)
    text = planner.why_not(model, sm.Layout(), 1)
    least = sm.step_memory(planner.padded(model, 1), sm.Layout(), "bf16", "full",
                           micro_batches=1)
    term = max(least.terms, key=least.terms.get)
    assert f"largest term {term} " in text and term != min(least.terms, key=least.terms.get)


def test_the_ties_are_the_families_within_the_error():
    fast, close, far = (_option(dict(matmul_f=s)) for s in (1.0, 1.03, 1.2))
    close = planner.replace(close, layout=sm.Layout(tp=2))
    far = planner.replace(far, layout=sm.Layout(tp=4))
    rows = [(o.layout, o) for o in (fast, close, far)]
    assert plan_compare.within_error(fast, rows, 0.055) == [fast, close]
    assert plan_compare.within_error(fast, rows, 0.0) == [fast]  # the plan ties with itself


def test_a_whole_chunk_or_none_recomputes_every_layer_of_the_chunk():
    """partial_full=False (Megatron-LM before --recompute-method block): when some layers must
    be recomputed whole, all of the chunk's are."""
    model = sm.GPTShape(8, 1024, 16, 2048, 50257)
    lay = sm.Layout(pp=2)
    some = planner.evaluate(model, lay, 4, "a100", 2.9 * GIB, base="selective")
    assert some is not None and 0 < some.full < 4
    every = planner.evaluate(model, lay, 4, "a100", 2.9 * GIB, base="selective",
                             partial_full=False)
    assert every.full == planner.chunk_layers(model.layers, lay) == 4


def test_stages_that_can_be_the_fullest():
    """Even stages: only the first and the last can hold the most; uneven: also the first
    middle stage with more layers than the first."""
    assert pipeline.distinct_stages(8, 4) == [0, 3]
    assert pipeline.distinct_stages(16, 4, 2) == [0, 3]
    assert pipeline.distinct_stages(10, 4) == [0, 1, 3]  # 2, 3, 3, 2


def test_deepspeeds_gradient_bucket_is_at_most_the_stage():
    """DeepSpeed reduces its gradients in buckets of reduce_bucket_size elements: a stage with
    fewer parameters holds them all, never a whole bucket."""
    ds = zero3.DEEPSPEED
    small, big = 10**6, 10**10
    live = min(2 * 10**6 + ds["prefetch_bucket"], ds["max_live"])
    assert zero3.transient_bytes("deepspeed", 2 * 10**6, small, 2, 4) == live * 2 + small * 4
    assert zero3.transient_bytes("deepspeed", 2 * 10**6, big, 2, 4) == \
        live * 2 + ds["reduce_bucket"] * 4


def test_the_default_micro_batches_reach_every_schedules_peak():
    """step_memory without m takes 2 p: past the interleaved schedule's m = p (every forward
    first) and enough for 1F1B's p - i."""
    for lay in (sm.Layout(pp=2, vp=2), sm.Layout(pp=4), sm.Layout(pp=4, vp=2)):
        default = sm.step_memory(SMALL, lay)
        assert default.terms == sm.step_memory(SMALL, lay, micro_batches=2 * lay.pp).terms


@pytest.mark.parametrize("x", [0, -1, float("nan")])
def test_the_efficiency_curve_needs_a_positive_width(x):
    with pytest.raises(ValueError, match="positive GEMM dimension"):
        efficiency.curve(x)


@pytest.mark.parametrize("layout", [sm.Layout(), sm.Layout(pp=2), sm.Layout(pp=2, vp=2),
                                    sm.Layout(pp=3), sm.Layout(tp=2, sp=True)])
def test_selective_time_is_not_charged_on_layers_recomputed_whole(layout):
    """Selective recompute with every layer of each chunk recomputed whole takes the full
    recompute's time term by term (same attention kernel): a whole layer reruns its forward,
    never its attention core a second time on top."""
    model = sm.GPTShape(12, 512, 8, 512, 4096)
    n = planner.chunk_layers(model.layers, layout)
    kw = dict(micro_batches=2 * layout.pp)
    every = step_time.step_time(model, layout, "a100", "bf16", "selective", n, **kw)
    full = step_time.step_time(model, layout, "a100", "bf16", "full", **kw)
    assert every.terms == pytest.approx(full.terms, rel=1e-12)
    some = step_time.step_time(model, layout, "a100", "bf16", "selective", 1, **kw)
    assert full.terms["recompute"] > some.terms["recompute"] > \
        step_time.step_time(model, layout, "a100", "bf16", "selective", 0, **kw).terms["recompute"]
