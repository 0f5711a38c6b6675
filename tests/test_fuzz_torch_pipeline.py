"""The pipeline demo (ckptlab.torch.pipelined) on random valid options: 2 gloo ranks, random
heads (1 included), sequence length (1 included), layers, block schedule, attention, pipeline
schedule and micro-batches. Every stage's saved bytes equal the prediction and the closed form
exactly, and it trains as one process does: the report says "all equal". Slow (processes)."""

import random

import pytest

pytest.importorskip("torch.distributed")  # PyTorch missing: this module is skipped

from ckptlab.torch import pipeline, pipelined  # noqa: E402
from ckptlab.torch.training import Config  # noqa: E402


def random_demo(rng):
    heads = rng.choice([1, 2, 4])
    m = rng.choice([2, 4])
    cfg = Config(steps=2, layers=rng.choice([2, 3, 4]), width=heads * rng.choice([8, 16]),
                 heads=heads, seq=rng.choice([1, 3, 8]), batch=m * rng.choice([1, 2]),
                 vocab=16, attn=rng.choice(["flash", "stored", "flash", "math"]),
                 schedule=rng.choice(["none", "every(1)", "sqrt", "optimal(100%)"]),
                 seed=rng.randrange(9))
    kinds = rng.choice([pipeline.SCHEDULES, ("gpipe",), ("1f1b",)])
    return cfg, kinds, m


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_random_pipeline_demos_are_all_equal(seed):
    cfg, kinds, m = random_demo(random.Random(seed))
    result = pipelined.run(2, cfg, kinds, microbatches=m)
    assert pipelined.check(result) == [], (cfg, kinds, m)
    assert "all equal" in pipelined.report(result)
