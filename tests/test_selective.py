"""The two selective schedules, told apart: keep(matmul) (every block checkpointed, matmul
outputs kept, everything else recomputed) and recompute(attn) (Korthikanti et al.'s selective
recompute: no block checkpointed, only the attention core redone in the backward). Each is
exact against its prediction, gives the plain step's gradients bit for bit, and holds and
recomputes what a hand count of the model says."""

import numpy as np
import pytest

from ckptlab import engine, models
from ckptlab.engine import Tensor, tape
from ckptlab.recompute import ledger, schedules

R = np.random.default_rng(13)


def gpt_case(attn, p, layers=3, B=2, N=17, C=12, H=3):
    gpt = models.GPT(vocab=29, ctx=N, width=C, heads=H, layers=layers, dropout=p, attn=attn,
                     seed=3)
    x, y = R.integers(0, 29, size=(B, N)), R.integers(0, 29, size=(B, N))
    prof = gpt.profile(x, y, policies=["matmul"], recompute=[{"attention"}])
    return gpt, x, y, prof


def run(model, x, y, schedule):
    engine.manual_seed(5)
    model.zero_grad()
    with ledger.record(timeline=False) as led:
        model.loss(Tensor(x), y, schedule=schedule).backward()
    return led, {n: g.copy() for n, g in model.grads().items()}


@pytest.mark.parametrize("attn", ["naive", "flash"])
@pytest.mark.parametrize("p", [0.0, 0.2])
def test_recompute_attn_is_exact_and_bitwise(attn, p):
    gpt, x, y, prof = gpt_case(attn, p)
    _, plain = run(gpt, x, y, None)
    for spec in ("recompute(attn)", "keep(matmul)"):
        sched = schedules.make(spec, prof=prof)
        led, grads = run(gpt, x, y, sched)
        pred = sched.predict(prof)
        assert (led.peak, led.flops["recompute"]) == (pred.peak_bytes, pred.recompute_flops)
        for n in plain:
            assert np.array_equal(grads[n], plain[n]), (spec, n)


def test_recompute_attn_drops_p_and_redoes_qk_and_softmax():
    """Naive attention keeps P (B, H, N, N) per block; recompute(attn) keeps none of it and
    redoes S = Q K^T (2 B H N^2 d FLOPs; the softmax is pointwise, not counted: matmul FLOPs
    only, the convention of ckptlab.measure.traffic) per block."""
    layers, B, N, C, H = 3, 2, 17, 12, 3
    gpt, x, y, prof = gpt_case("naive", 0.0, layers, B, N, C, H)
    none = schedules.make("none", prof=prof).predict(prof)
    core = schedules.make("recompute(attn)", prof=prof).predict(prof)
    P_bytes = B * H * N * N * 8  # float64
    assert none.peak_bytes - core.peak_bytes == layers * P_bytes
    d = C // H
    assert core.recompute_flops == layers * 2 * B * H * N * N * d
    assert none.recompute_flops == 0


def test_names_say_what_is_kept():
    assert schedules.make("keep(matmul)", 4).name == "keep(matmul)"
    assert schedules.make("selective(matmul)", 4).name == "keep(matmul)"  # the old spelling
    s = schedules.make("recompute(attn)", 4)
    assert s.name == "recompute(attn)" and s.plan == [0, 1, 2, 3]
    assert s.recompute_ops == frozenset({"attention"})
    with pytest.raises(ValueError, match="recompute"):
        schedules.make("recompute(mlp)", 4)
    with pytest.raises(ValueError, match="cannot recompute"):
        tape.recomputing({"matmul"})


def test_prediction_without_the_profiled_mode_is_refused():
    gpt = models.GPT(vocab=11, ctx=5, width=8, heads=2, layers=2, attn="naive", seed=0)
    x, y = R.integers(0, 11, size=(1, 5)), R.integers(0, 11, size=(1, 5))
    with pytest.raises(ValueError, match="recompute="):
        schedules.make("recompute(attn)", 2).predict(gpt.profile(x, y))


def test_kernels_backend_refuses_the_recomputed_core():
    gpt = models.GPT(vocab=11, ctx=5, width=8, heads=2, layers=1, attn="naive",
                     backend="kernels", seed=0)
    x, y = R.integers(0, 11, size=(1, 5)), R.integers(0, 11, size=(1, 5))
    with pytest.raises(ValueError, match="numpy"):
        gpt.loss(x, y, schedule=schedules.make("recompute(attn)", 1))


def test_keep_matmul_holds_more_than_none_on_a_relu_mlp():
    """Why keep(matmul) peaks above none on the MLP (48.5 vs 40.2 MiB in the benchmark): a
    plain block keeps its input x and ReLU's output h; keep(matmul) keeps x, the first
    matmul's output z1 (the size of h) and the second's z2 (the size of x), which no plain
    backward needs; its recompute then makes h again on top."""
    Bn, D, layers = 3, 8, 5
    mlp = models.MLP(width=D, layers=layers, seed=0)
    x, y = R.standard_normal((Bn, D)), R.integers(0, 8, Bn)
    prof = mlp.profile(x, y, policies=["matmul"])
    block = prof.stages[0]
    policy = next(iter(block.stored))
    assert sorted(block.saved.values()) == [Bn * D * 8, Bn * 4 * D * 8]  # x, h
    assert sorted(block.stored[policy].values()) == [Bn * D * 8, Bn * 4 * D * 8]  # z2, z1
    none = schedules.make("none", prof=prof).predict(prof)
    keep = schedules.make("keep(matmul)", prof=prof).predict(prof)
    head = sum(prof.stages[-1].saved.values())  # its input (the last output), logits, ...
    # keep: every block's (x, z1, z2), then one recomputed h; none: (x, h) each and the head
    assert keep.peak_bytes == layers * Bn * 6 * D * 8 + Bn * 4 * D * 8
    assert none.peak_bytes == layers * Bn * 5 * D * 8 + head
    assert keep.peak_bytes > none.peak_bytes
