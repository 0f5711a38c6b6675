"""ckptlab.cluster.step_memory on paper: ZeRO's own numbers (Rajbhandari et al. 2020, Figure 1:
7.5B parameters on 64 GPUs), Korthikanti's per-layer table where the model has dropout and
leaves LayerNorm's statistics out, GPT-3's parameter count, and steps worked by hand on a model
small enough to check on paper (L=4, h=8, a=2, s=4, V=16) for every parameter that changes the
answer: tensor and sequence parallelism, pipeline stages and virtual stages, ZeRO stages and
recipes, the loss; bad input refused in one line. (Measured against PyTorch:
tests/test_torch_step_memory.py and tests/test_torch_loss_memory.py.)"""

import pytest

from ckptlab.cluster import at_scale
from ckptlab.cluster import step_memory as sm

SMALL = dict(layers=4, hidden=8, heads=2, seq=4, vocab=16)
SBH = 4 * 1 * 8  # s b h at micro-batch 1


@pytest.mark.parametrize("zero,gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_figure_1(zero, gb):
    states = sm.model_states(7_500_000_000, "bf16", dp=64, zero=zero)
    assert sum(states.values()) / 1e9 == pytest.approx(gb, abs=0.05)


@pytest.mark.parametrize("zero,want", [(0, (2000, 2000, 12000)), (1, (2000, 2000, 3000)),
                                       (2, (2000, 500, 3000)), (3, (500, 500, 3000))])
def test_zero_stages_by_hand(zero, want):
    """1000 parameters on 4 ranks, 2 + 2 + 12 bytes each; stage 1 shards the 12, 2 the
    gradients too, 3 the weights too."""
    got = sm.model_states(1000, "bf16", dp=4, zero=zero)
    assert (got["params"], got["grads"], got["optimizer"]) == want


def test_megatron_recipe_is_18_bytes_and_6_plus_12_over_d():
    """Megatron-Core's distributed optimizer docs: fp32 main gradients, 18 bytes a parameter;
    with the optimizer sharded over d, 6 + 12 / d."""
    assert sum(sm.model_states(1000, "bf16-fp32grad").values()) == 18 * 1000
    assert sum(sm.model_states(1000, "bf16-fp32grad", dp=4, zero=1).values()) == \
        (6 + 12 // 4) * 1000
    assert sum(sm.model_states(1000, "bf16").values()) == 16 * 1000  # ZeRO's, 16-bit grads


@pytest.mark.parametrize("recompute", sm.RECOMPUTE)
@pytest.mark.parametrize("t,sp", [(1, False), (2, False), (4, True)])
def test_layer_term_is_korthikanti_with_dropout(recompute, t, sp):
    s, b, h, a = 2048, 3, 1536, 12
    assert sm.layer_activations(s, b, h, a, recompute, t, sp, 2, dropout=True) == \
        at_scale.layer_activation_bytes(s, b, h, a, recompute, t, sp)


def test_gpt3_has_175b_parameters():
    gpt3 = sm.GPTShape(96, 12288, 96, 2048, 51200)
    assert gpt3.params() == pytest.approx(175e9, rel=0.005)
    # replicated: LayerNorms, row-split biases, position embeddings: 0.13% more than 1/8
    assert gpt3.params() / 8 < gpt3.params(8) < gpt3.params() / 8 * 1.002


def test_a_step_by_hand():
    """L=2, h=8, a=2, s=4, V=16, untied, micro-batch 3, dp=2 with ZeRO-3, fp32 Adam, no
    dropout, no recompute, PyTorch's loss."""
    g = sm.GPTShape(layers=2, hidden=8, heads=2, seq=4, vocab=16, tied=False)
    psi = 2 * (12 * 64 + 13 * 8) + 16 * 8 + 4 * 8 + 2 * 8 + 16 * 8  # layers, wte, wpe, ln, head
    m = sm.step_memory(g, sm.Layout(dp=2, zero=3, micro_batch=3), "fp32", "none",
                       dropout=False)
    assert m.terms["params"] == m.terms["grads"] == psi * 4 // 2
    assert m.terms["optimizer"] == psi * 8 // 2
    sbh = 4 * 3 * 8
    layer = 16 * 4 * sbh + 4 * 2 * 4 * 4 * 3  # 16 s b h values, softmax a s^2 b, fp32
    embed, head = 8 * 12 + 8 * 4, 2 * 4 * sbh + 4 * 12 * 16 + 8 * 12 + 4
    assert m.terms["activations"] == embed + 2 * layer + max(head, 0)
    unit = 12 * 64 + 13 * 8
    # the loss's backward: nll_loss_backward's and _log_softmax_backward_data's fp32 buffers
    assert m.transients == {"fsdp units": unit * 12, "loss backward": 2 * 4 * 12 * 16}
    assert m.peak == sum(m.terms.values()) + unit * 12


def test_tensor_and_sequence_parallel_by_hand():
    """t = 2 with SP, fp32, no dropout, LayerNorm statistics, Megatron's fused loss."""
    g = sm.GPTShape(**SMALL, tied=False)
    # a layer on one rank: (12 h^2 + 7 h) / 2 split, the row-split biases and LayerNorms (6 h)
    # replicated: (768 + 56) / 2 + 48
    assert g.layer_params(2) == 460
    psi = 4 * 460 + 16 * 8 // 2 + 4 * 8 + 2 * 8 + 16 * 8 // 2  # + wte / t, wpe, final LN, head / t
    m = sm.step_memory(g, sm.Layout(tp=2, sp=True), "fp32", "none", dropout=False,
                       ln_stats=True, loss="fused")
    assert m.terms["params"] == 4 * psi == 8064
    # a layer, 4 bytes a value: LN, QKV and MLP inputs (4 s b h) / t with SP; Q, K, V, the
    # projection input, GeLU's input and output (12 s b h) / t; the softmax (a s^2 b) / t;
    # LayerNorm's mean and rstd (16 s b) / t with SP
    layer = 4 * 4 * SBH // 2 + 12 * 4 * SBH // 2 + 4 * 2 * 16 // 2 + 16 * 4 // 2
    assert layer == 1120
    embed = 8 * 4 + 8 * 4
    # the head: final LN's input and output / t, its statistics / t, the fused loss's fp32
    # softmax over V / t, its mask (1 byte) and int64 targets
    head = 2 * 4 * SBH // 2 + 8 * 4 // 2 + 4 * 4 * 16 // 2 + 9 * 4
    assert m.terms["activations"] == embed + 4 * layer + head == 4852
    assert m.transients == {"loss backward": 0}  # fp32: the gradient is written in place
    bf16 = sm.step_memory(g, sm.Layout(tp=2, sp=True), "bf16", "none", loss="fused")
    assert bf16.transients["loss backward"] == 2 * 4 * 16 // 2  # the 16-bit copy, / t
    torch_loss = sm.step_memory(g, sm.Layout(tp=2, sp=True), "fp32", "none", dropout=False,
                                ln_stats=True, loss="torch")
    # PyTorch's loss needs the whole vocabulary on each rank: 4 s b V saved, 8 s b V transient
    assert torch_loss.terms["activations"] - m.terms["activations"] == \
        (4 * 4 * 16 + 8 * 4 + 4) - (4 * 4 * 16 // 2 + 9 * 4)
    assert torch_loss.transients == {"loss backward": 8 * 4 * 16}


def test_full_recompute_with_sp_keeps_a_share_of_the_input():
    """Full recompute keeps each layer's input; sequence parallelism splits it: 2 s b h / t."""
    s, b, h, a = 2048, 1, 12288, 96
    assert at_scale.layer_activation_bytes(s, b, h, a, "full", 8, sp=True) == 2 * s * b * h // 8
    assert at_scale.layer_activation_bytes(s, b, h, a, "full", 8, sp=False) == 2 * s * b * h


def test_pipeline_1f1b_by_hand():
    """p = 2, m = 4, fp32, untied, no dropout, PyTorch's loss: stage 0 holds its 2 layers for
    p - 0 = 2 micro-batches, with the embeddings; stage 1 one micro-batch, with the head."""
    g = sm.GPTShape(**SMALL, tied=False)
    lay = sm.Layout(pp=2)
    layer = 16 * 4 * SBH + 4 * 2 * 16  # 16 s b h values and the softmax, fp32: 2176
    first = sm.step_memory(g, lay, "fp32", "none", dropout=False, micro_batches=4, stage=0)
    assert first.terms["params"] == 4 * (2 * 872 + 16 * 8 + 4 * 8)  # 2 layers, wte, wpe
    assert first.terms["activations"] == 2 * (2 * layer + 8 * 4 + 8 * 4)
    assert first.transients == {}
    last = sm.step_memory(g, lay, "fp32", "none", dropout=False, micro_batches=4, stage=1)
    assert last.terms["params"] == 4 * (2 * 872 + 2 * 8 + 16 * 8)  # 2 layers, final LN, head
    head = 2 * 4 * SBH + 4 * 4 * 16 + 8 * 4 + 4
    assert last.terms["activations"] == 2 * layer + head
    assert last.transients == {"loss backward": 8 * 4 * 16}
    worst = sm.step_memory(g, lay, "fp32", "none", dropout=False, micro_batches=4)
    assert (worst.stage, worst.stages) == (0, {0: first.peak, 1: last.peak})
    # one micro-batch a step: stage 0 holds one, as stage 1 does
    one = sm.step_memory(g, lay, "fp32", "none", dropout=False, micro_batches=1, stage=0)
    assert one.terms["activations"] == 2 * layer + 8 * 4 + 8 * 4
    # a tied head: with p > 1 the last stage keeps its own copy of the word embedding
    tied = sm.GPTShape(**SMALL, tied=True)
    assert tied.stage_params(1, 2, 1) == g.stage_params(1, 2, 1)
    assert tied.params() == g.params() - 16 * 8


def test_pipeline_interleaved_by_hand():
    """p = 2, v = 2 (one layer a chunk), m = 4: stage 0 holds 4 + 1 = 5 chunks in flight at
    its peak (chunk 0 filling past the first backward), stage 1 holds 2 + 1 = 3
    (ckptlab.cluster.pipeline)."""
    g = sm.GPTShape(**SMALL, tied=False)
    lay = sm.Layout(pp=2, vp=2)
    layer = 16 * 4 * SBH + 4 * 2 * 16
    first = sm.step_memory(g, lay, "fp32", "none", dropout=False, micro_batches=4, stage=0)
    # the ids: once for each micro-batch in flight in chunk 0 (4)
    assert first.terms["activations"] == 5 * layer + 4 * (8 * 4 + 8 * 4)
    last = sm.step_memory(g, lay, "fp32", "none", dropout=False, micro_batches=4, stage=1)
    head = 2 * 4 * SBH + 4 * 4 * 16 + 8 * 4 + 4
    assert last.terms["activations"] == 3 * layer + head
    # m = p: Megatron runs all m v = 4 forwards first; the last stage holds both micro-batches
    # of each chunk, and so two heads
    warm = sm.step_memory(g, lay, "fp32", "none", dropout=False, micro_batches=2, stage=1)
    assert warm.terms["activations"] == 4 * layer + 2 * head
    with pytest.raises(ValueError, match="multiple of p = 2"):
        sm.step_memory(g, lay, "fp32", micro_batches=3)


def test_recompute_and_dropout_by_hand():
    """bf16, t = 1: dropout adds two 1-byte masks a layer and the embedding's; the first k
    layers of each stage recomputed whole keep their input (2 s b h) only."""
    g = sm.GPTShape(**SMALL)
    base = sm.step_memory(g, sm.Layout(), "bf16", "selective", dropout=False)
    drop = sm.step_memory(g, sm.Layout(), "bf16", "selective", dropout=True)
    assert drop.terms["activations"] - base.terms["activations"] == 4 * 2 * SBH + SBH
    one = sm.layer_activations(4, 1, 8, 2, "selective", dropout=False)
    assert one == 16 * 2 * SBH  # 34 s b h less the two masks, 2 bytes a value
    k1 = sm.step_memory(g, sm.Layout(), "bf16", "selective", dropout=False, full_layers=1)
    assert base.terms["activations"] - k1.terms["activations"] == one - 2 * SBH


def test_flash_backward_holds_its_dq_accumulator_not_the_core():
    """FlashAttention keeps L (fp32, a s b) beside the 34 s b h, and its backward holds only the
    fp32 dQ accumulator (4 s b h) and D (4 a s b), not an N x N matrix; a recompute of the
    attention core (selective) holds the core it rebuilt."""
    g = sm.GPTShape(layers=4, hidden=8, heads=2, seq=64, vocab=16)  # s large: the core is big
    s, b, h, a = 64, 1, 8, 2
    kw = dict(dropout=False, loss="fused")
    flash = sm.step_memory(g, sm.Layout(), "bf16", "flash", **kw).terms["activations"]
    layer = 16 * 2 * s * b * h + 4 * a * s * b
    embed = 8 * s * b + 8 * s
    head = 2 * 2 * s * b * h + 4 * s * b * 16 + 9 * s * b
    dq_and_d = 4 * s * b * h + 4 * a * s * b
    assert flash == embed + 4 * layer + max(head, dq_and_d)
    assert 2 * a * s * s * b - 4 * a * s * b > head  # not the core: that would be the larger
    sel = sm.step_memory(g, sm.Layout(), "bf16", "selective", **kw).terms["activations"]
    core = 2 * a * s * s * b  # the recomputed softmax output, 16-bit, no dropout
    assert sel == embed + 4 * 16 * 2 * s * b * h + core


@pytest.mark.parametrize("layout", [sm.Layout(), sm.Layout(tp=2, sp=True),
                                    sm.Layout(pp=2, micro_batch=2), sm.Layout(pp=2, vp=2)])
@pytest.mark.parametrize("base", ["none", "selective", "flash"])
@pytest.mark.parametrize("seq,vocab", [(64, 32), (256, 32), (64, 8192)])
def test_fewest_full_layers_is_the_smallest_k_that_fits(layout, base, seq, vocab):
    """Against a scan of every k on every stage, for memories from too small to plenty; a long
    sequence (the recompute transient grows near k = n) and a large vocabulary (the last stage
    the fullest) too."""
    g = sm.GPTShape(layers=8, hidden=64, heads=4, seq=seq, vocab=vocab)
    kw = dict(recipe="bf16", recompute=base, micro_batches=4)
    n = 8 // (layout.pp * layout.vp)
    peaks = [max(sm.step_memory(g, layout, full_layers=k, stage=i, **kw).peak
                 for i in range(layout.pp)) for k in range(n + 1)]
    if vocab == 8192 and layout.pp == 2:
        assert sm.step_memory(g, layout, **kw).stage == 1  # the head's stage is the fullest
    for memory in sorted(set(peaks)) + [min(peaks) - 1, max(peaks) + 1]:
        want = next((k for k, x in enumerate(peaks) if x <= memory), None)
        assert sm.fewest_full_layers(g, layout, memory, **kw) == want, memory


@pytest.mark.parametrize("call,message", [
    (lambda: sm.model_states(10, "fp8"), "recipe: expected one of"),
    (lambda: sm.model_states(-10), "psi: expected a parameter count"),
    (lambda: sm.model_states(2.5), "psi: expected"),
    (lambda: sm.Layout(zero=4), "zero: expected a ZeRO stage"),
    (lambda: sm.Layout(zero=True), "zero: expected a ZeRO stage"),
    (lambda: sm.Layout(pp=0), "pp: expected a positive int"),
    (lambda: sm.Layout(vp=2), "need a pipeline"),
    (lambda: sm.Layout(sp=1), "sp: expected True or False"),
    (lambda: sm.GPTShape(0, 8, 2, 4, 16), "layers: expected a positive int"),
    (lambda: sm.GPTShape(2.5, 8, 2, 4, 16), "layers: expected a positive int"),
    (lambda: sm.GPTShape(True, 8, 2, 4, 16), "layers: expected a positive int"),
    (lambda: sm.GPTShape(2, 8, 2, 4, 0), "vocab: expected a positive int"),
    (lambda: sm.GPTShape(2, 8, 2, 4, -16), "vocab: expected a positive int"),
    (lambda: sm.GPTShape(2, 8, 3, 4, 16), "heads = 3 must divide"),
    (lambda: sm.step_memory(sm.GPTShape(2, 8, 2, 4, 16), sm.Layout(tp=4)), "tp = 4 must divide"),
    (lambda: sm.step_memory(sm.GPTShape(2, 8, 2, 4, 16), sm.Layout(tp=3)), "tp = 3 must divide"),
    (lambda: sm.step_memory(sm.GPTShape(2, 8, 2, 4, 16), sm.Layout(), optimizer="lion"),
     "optimizer: expected one of"),
    (lambda: sm.step_memory(sm.GPTShape(2, 8, 2, 4, 16), sm.Layout(), loss="mse"),
     "loss: expected one of"),
    (lambda: sm.step_memory(sm.GPTShape(2, 8, 2, 4, 16), sm.Layout(pp=3)), "cannot fill 3"),
    (lambda: sm.step_memory(sm.GPTShape(3, 8, 2, 4, 16), sm.Layout(pp=2, vp=2)), "p x v = 2"),
    (lambda: sm.step_memory(sm.GPTShape(2, 8, 2, 4, 16), sm.Layout(), stage=1), "stage:"),
    (lambda: sm.step_memory(sm.GPTShape(2, 8, 2, 4, 16), sm.Layout(), full_layers=3),
     "full_layers: expected an int in"),
    (lambda: sm.step_memory((2, 8), sm.Layout()), "model: expected a GPTShape or LlamaShape"),
])
def test_bad_input_is_one_clear_line(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()
