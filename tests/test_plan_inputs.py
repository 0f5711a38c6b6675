"""The planner's inputs and its report's words: a memory that is not a positive, finite number
of bytes is refused in one line (not answered "nothing fits"), and a layout the search only
pruned as slower is never listed as one that does not fit."""

import math

import pytest

from ckptlab.cli import plan as plan_cli
from ckptlab.cluster import planner
from ckptlab.cluster import step_memory as sm

GIB = 1024**3
SMALL = sm.GPTShape(8, 512, 8, 512, 4096)


@pytest.mark.parametrize("memory", [math.nan, 0, -1, -GIB, math.inf, "80", None, True])
def test_a_memory_that_is_no_size_is_refused(memory):
    with pytest.raises(ValueError, match="memory: expected a positive, finite number") as e:
        planner.plan(SMALL, 1, "a100", memory, batch=8)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kw", [dict(gpus=0), dict(gpus=-4), dict(gpus=2.5), dict(gpus=True),
                                dict(batch=0), dict(batch=-8), dict(batch=8.0),
                                dict(micro_batch=0)])
def test_gpus_and_batch_that_are_no_counts_are_refused(kw):
    args = dict(gpus=8, batch=8) | kw
    with pytest.raises(ValueError, match="expected a positive int"):
        planner.plan(SMALL, memory=8 * GIB, gpu="a100", **args)


def test_a_pruned_layout_is_not_said_to_miss_the_memory():
    """The search skips layouts whose matmuls alone outlast the runner-up's step: the report
    says so under its own words, never "does not fit"."""
    chosen, rows = planner.plan(SMALL, 16, "a100", 8 * GIB, batch=32)
    pruned = [lay for lay, o in rows if planner.is_pruned(o)]
    assert pruned and chosen is not None
    text = plan_cli.report(SMALL, chosen, rows, 16, "a100", 8 * GIB, "bf16", everything=True,
                           batch=32)
    does_not_fit = [line for line in text.splitlines() if "does not fit" in line]
    assert not any("matmuls alone" in line for line in does_not_fit)
    listed = [line for line in text.splitlines() if "pruned, slower than the best" in line]
    fitting = {planner.family(o.layout) for _, o in rows if isinstance(o, planner.Option)}
    assert len(listed) == len({planner.family(lay) for lay in pruned} - fitting) >= 1
    for _, o in rows:  # every "does not fit" reason is one the memory or the batch gives
        if isinstance(o, str) and not planner.is_pruned(o):
            assert o.startswith(("needs", "batch")), o


def test_head_dims_the_attention_model_has_kernels_for():
    """A head dimension that is a multiple of 8 in [8, 256] plans; the ends included."""
    for d in (8, 256):
        planner.check_limits(sm.GPTShape(2, 2 * d, 2, 64, 64), 1)
    for d in (4, 12, 264):
        with pytest.raises(ValueError, match="head dim"):
            planner.check_limits(sm.GPTShape(2, 2 * d, 2, 64, 64), 1)
