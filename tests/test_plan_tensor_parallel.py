"""ckptlab.cluster.planner at t = 2, by hand: the vocabulary padded to a multiple of 128 t (as
Megatron-LM's --make-vocab-size-divisible-by), which the option's memory is modeled with, and an
option's recompute FLOPs per GPU (each tensor-parallel rank redoes 1/t of its layers' work).
The tensor- and data-parallel communication at t, d > 1 is worked by hand in
tests/test_step_time.py; the heads a node cannot split in tests/test_cli_plan.py."""

import dataclasses

import pytest

from ckptlab.cluster import planner
from ckptlab.cluster import step_memory as sm

A100 = "A100-SXM4-80GB"
G = sm.GPTShape(layers=4, hidden=256, heads=4, seq=128, vocab=1100)
PLENTY = 80 * 2**30


def test_the_vocabulary_is_padded_to_a_multiple_of_128_t():
    """1100 up to a multiple of 128: 9 x 128 = 1152; of 256 (t = 2): 5 x 256 = 1280; of 512
    (t = 4): 3 x 512 = 1536. GPT-2's 50257 at t = 2: 197 x 256 = 50432 (50304 at t = 1)."""
    assert [planner.padded(G, t).vocab for t in (1, 2, 4)] == [1152, 1280, 1536]
    gpt2 = sm.GPTShape(12, 768, 12, 1024, 50257)
    assert (planner.padded(gpt2, 1).vocab, planner.padded(gpt2, 2).vocab) == (50304, 50432)
    # the option at t = 2 is modeled with the padded vocabulary: its head and embedding on a
    # rank are 1280 / 2 = 640 rows, not 1152 / 2 = 576
    opt = planner.evaluate(G, sm.Layout(tp=2), 2, A100, PLENTY, base="selective", full=0)
    want = sm.step_memory(dataclasses.replace(G, vocab=1280), sm.Layout(tp=2), "bf16",
                          "selective", loss="torch", micro_batches=2)
    assert opt.memory.terms == want.terms and opt.peak == want.peak


@pytest.mark.parametrize("full", [0, 1])
def test_recompute_flops_per_gpu_are_split_by_t(full):
    """b = 1, s = 128, h = 256, t = 2, m = 2 micro-batches, 4 layers on the one stage.
    Selective recomputes the attention core's forward, 4 b s^2 h = 4 x 128^2 x 256 = 16,777,216
    FLOPs a layer; a layer recomputed whole its forward, 24 b s h^2 + 4 b s^2 h = 201,326,592 +
    16,777,216 = 218,103,808. Per GPU per step: m x (layers' FLOPs) / t.
      full = 0: 2 x 4 x 16,777,216 / 2 = 67,108,864
      full = 1: 2 x (218,103,808 + 3 x 16,777,216) / 2 = 268,435,456"""
    opt = planner.evaluate(G, sm.Layout(tp=2), 2, A100, PLENTY, base="selective", full=full)
    assert opt.recompute_flops == {0: 67_108_864, 1: 268_435_456}[full]
