"""`plan` and `bench plan-check` on random valid cases: GPT and Llama shapes (grouped-query
attention), GPUs, GPU counts, batches, memories, ZeRO-3 implementations and uneven pipelines.
Each plan holds its invariants: the plan fits and no evaluated layout is faster; the runner-up
is of another family and no faster; the ties are within the model's error; a peak is the sum
of its terms and the fullest stage's; an uneven split sums to L. Each plan-check row: fits
exactly when the published layout's peak is within the memory, and its error is modeled /
published - 1. Seeded; a few cases by default, a wider sweep under `slow`."""

import math
import random

import pytest

from ckptlab.cli import bench_plan_check as pc
from ckptlab.cluster import pipeline, plan_compare, planner, published_runs
from ckptlab.cluster import step_memory as sm

GIB = 2**30


def random_model(rng):
    heads = rng.choice([4, 8, 16])
    d = rng.choice([64, 128])
    layers = rng.choice([3, 4, 5, 6, 7, 8, 10, 12])
    seq, vocab = rng.choice([128, 512, 2048]), rng.choice([1000, 4096, 32000])
    if rng.random() < 0.5:
        return sm.GPTShape(layers, heads * d, heads, seq, vocab, tied=rng.random() < 0.5)
    kv = rng.choice([k for k in (1, 2, 4, 8) if heads % k == 0])
    return sm.LlamaShape(layers, heads * d, heads, kv, rng.choice([2, 3, 4]) * heads * d, seq,
                         vocab, tied=rng.random() < 0.3)


def random_plan_case(rng):
    model = random_model(rng)
    gpus = rng.choice([1, 2, 4, 8, 16])
    batch = rng.choice([None, gpus, 2 * gpus, 4 * gpus, 3 * gpus + 1])
    memory = rng.choice([1, 4, 16, 24, 40, 80]) * GIB * rng.choice([1, 0.75])
    return model, gpus, rng.choice(["a100", "h100", "a100-40gb"]), memory, batch, \
        rng.choice(["fsdp", "deepspeed"])


def check_plan(model, gpus, gpu, memory, batch, zero3):
    chosen, rows = planner.plan(model, gpus, gpu, memory, batch, zero3=zero3)
    fits = [o for _, o in rows if isinstance(o, planner.Option)]
    for lay, o in rows:
        if lay.pp > 1:
            assert sum(pipeline.split_layers(model.layers, lay.pp)) == model.layers
        if isinstance(o, planner.Option):
            assert o.peak <= memory and o.layout == lay
            assert o.peak == sum(o.memory.terms.values()) + max(o.memory.transients.values(),
                                                                default=0)
            assert o.memory.stages[o.memory.stage] == o.peak == max(o.memory.stages.values())
            if lay.zero == 3:
                assert lay.zero3 == zero3
    if chosen is None:
        assert not fits
        return
    assert all((chosen.step_s, chosen.peak) <= (o.step_s, o.peak) for o in fits)
    # the fullest stage sets the peak: every stage computed on its own holds no more
    shaped = planner.padded(model, chosen.layout.tp)
    kw = dict(recompute=chosen.base, full_layers=chosen.full, micro_batches=chosen.micro_batches)
    stages = [sm.step_memory(shaped, chosen.layout, stage=i, **kw).peak
              for i in range(chosen.layout.pp)]
    assert max(stages) == chosen.peak
    second = plan_compare.runner_up(chosen, rows)
    others = [o for o in fits if planner.family(o.layout) != planner.family(chosen.layout)]
    if second is None:
        assert not others
    else:
        assert planner.family(second.layout) != planner.family(chosen.layout)
        assert chosen.step_s <= second.step_s == min(o.step_s for o in others)
    close = plan_compare.within_error(chosen, rows)
    assert close[0].step_s == chosen.step_s
    assert all(o.step_s <= chosen.step_s * (1 + plan_compare.MODEL_ERROR) for o in close)
    assert len({planner.family(o.layout) for o in close}) == len(close)
    for _, o in rows:  # a pruned layout's matmuls alone outlast the runner-up's whole step
        if planner.is_pruned(o):
            assert second is not None
            assert float(o.split("take ")[1].split(" s")[0]) >= second.step_s * (1 - 1e-3)


@pytest.mark.parametrize("seed", range(8))
def test_random_plans_hold_their_invariants(seed):
    check_plan(*random_plan_case(random.Random(seed)))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8, 160))
def test_random_plans_hold_their_invariants_wide(seed):
    check_plan(*random_plan_case(random.Random(seed)))


def check_rows(table, achievable):
    for row in table:
        r = published_runs.run(row["run"])
        opt, _ = pc.published_option(r, achievable)
        assert row["fits"] is (opt is not None)
        if row["fits"]:
            assert row["peak_gib"] * GIB == opt.peak <= pc.memory_of(r)
            assert row["error"] == row["modeled_tflops"] / row["published_tflops"] - 1
            assert math.isfinite(row["error"]) and row["step_s"] > 0


@pytest.mark.parametrize("seed", range(2))
def test_plan_check_rows_on_random_efficiencies(seed):
    """Two small runs under a random compute efficiency: the rows stay consistent."""
    rng = random.Random(seed)
    achievable = rng.uniform(0.2, 0.9)
    names = rng.sample(["1.7B", "3.6B", "7.5B"], 1)
    check_rows(pc.rows(achievable, names), achievable)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_plan_check_rows_on_random_efficiencies_wide(seed):
    rng = random.Random(100 + seed)
    achievable = rng.choice([None, rng.uniform(0.2, 0.9)])
    names = rng.sample([r.name for r in published_runs.RUNS], 4)
    check_rows(pc.rows(achievable, names), achievable)
