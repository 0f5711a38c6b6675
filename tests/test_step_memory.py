"""ckptlab.measure.step_memory on paper: ZeRO's own numbers (Rajbhandari et al. 2020, Figure 1:
7.5B parameters on 64 GPUs), Korthikanti's per-layer table where the model has dropout and
leaves LayerNorm's statistics out, GPT-3's parameter count, one step worked by hand, and bad
input refused in one line. (Measured against PyTorch: tests/test_torch_step_memory.py.)"""

import pytest

from ckptlab.measure import at_scale
from ckptlab.measure import step_memory as sm


@pytest.mark.parametrize("zero,gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_figure_1(zero, gb):
    states = sm.model_states(7_500_000_000, "bf16", dp=64, zero=zero)
    assert sum(states.values()) / 1e9 == pytest.approx(gb, abs=0.05)


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
    dropout, no recompute."""
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
    assert m.transients == {"fsdp units": unit * 12, "logits grad": 4 * 12 * 16}
    assert m.peak == sum(m.terms.values()) + unit * 12


def test_bad_input_is_one_clear_line():
    g = sm.GPTShape(2, 8, 2, 4, 16)
    with pytest.raises(ValueError, match="recipe: expected one of"):
        sm.model_states(10, "fp8")
    with pytest.raises(ValueError, match="zero: expected a ZeRO stage"):
        sm.step_memory(g, sm.Layout(zero=4))
    with pytest.raises(ValueError, match="tp = 3 must divide"):
        sm.step_memory(g, sm.Layout(tp=3))
    with pytest.raises(ValueError, match="optimizer: expected one of"):
        sm.step_memory(g, sm.Layout(), optimizer="lion")
