"""ckptlab.torch.gpt_bytes: what nets.GPT saves, on paper, for every attention it runs, against
the bytes TorchLedger measures on one process (nothing recomputed, and every block
checkpointed), and the differences between the attention kinds worked by hand."""

import pytest

torch = pytest.importorskip("torch")

from ckptlab.cluster import step_memory  # noqa: E402
from ckptlab.torch import METHODS, demo, gpt_bytes  # noqa: E402

S, B, H, A = 9, 2, 32, 2  # seq, sequences, width, heads: a s = 18 < h + a, so flash keeps more


def test_the_attention_cores_differ_by_hand():
    """Per block, fp32: flash keeps O (4 s b h = 2,304) and L (4 a s b = 144) where the
    standard attention keeps P (4 a s^2 b = 1,296); stored keeps all three; SDPA's CPU flash
    kernel keeps L instead of P, its O being the out projection's input."""
    math_ = gpt_bytes.layer_bytes(S, B, H, A, "math")
    assert gpt_bytes.layer_bytes(S, B, H, A, "naive") == math_
    assert gpt_bytes.layer_bytes(S, B, H, A, "flash") - math_ == 2304 + 144 - 1296
    assert gpt_bytes.layer_bytes(S, B, H, A, "stored") - math_ == 2304 + 144
    assert gpt_bytes.layer_bytes(S, B, H, A, "sdpa") - math_ == 144 - 1296
    for attn in gpt_bytes.ATTENTION:  # checkpointed, a block keeps its input: 4 s b h
        assert gpt_bytes.layer_bytes(S, B, H, A, attn, "full") == 4 * S * B * H
    shape = step_memory.nets_gpt(1, H, A, S, 32)
    assert gpt_bytes.stage_bytes(shape, B, 1, True, True, "none", "sdpa", device="cuda") is None
    with pytest.raises(ValueError, match="attn: expected one of"):
        gpt_bytes.layer_bytes(S, B, H, A, "xformers")
    with pytest.raises(ValueError, match="in_flight: expected an int >= 1"):
        gpt_bytes.stage_bytes(shape, B, 1, True, True, "none", "math", in_flight=0)


@pytest.mark.parametrize("attn", [a for a in gpt_bytes.ATTENTION
                                  if a in METHODS or a in ("sdpa", "math")])
@pytest.mark.parametrize("schedule,recompute", [("none", "none"), ("every(1)", "full")])
def test_modeled_equals_measured(attn, schedule, recompute):
    cfg = demo.Config(steps=1, layers=2, width=H, heads=A, seq=S, batch=B, vocab=32, attn=attn,
                      schedule=schedule)
    measured = demo.train(0, 1, cfg, ddp=False)["peaks"][0]  # one process, the whole batch
    shape = step_memory.nets_gpt(cfg.layers, H, A, S, cfg.vocab)
    assert gpt_bytes.stage_bytes(shape, B, cfg.layers, True, True, recompute, attn) == measured


@pytest.mark.parametrize("attn", ["flash", "stored"])
@pytest.mark.parametrize("seq,heads", [(S, 1), (1, A)])
def test_one_head_or_one_position_keeps_no_transposed_copy(attn, seq, heads):
    """With one head or one position, O.transpose(1, 2) is already laid out as the out
    projection's input, so reshape gives a view: O is held once, not twice (the pipeline demo
    reported MISMATCH there while it counted the copy)."""
    assert not gpt_bytes.transposed_copy(seq, heads)
    cfg = demo.Config(steps=1, layers=2, width=H, heads=heads, seq=seq, batch=B, vocab=32,
                      attn=attn, schedule="none")
    measured = demo.train(0, 1, cfg, ddp=False)["peaks"][0]
    shape = step_memory.nets_gpt(cfg.layers, H, heads, seq, cfg.vocab)
    assert gpt_bytes.stage_bytes(shape, B, cfg.layers, True, True, "none", attn) == measured
