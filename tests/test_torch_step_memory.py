"""ckptlab.cluster.step_memory against measurement. In this process (cheap): the saved bytes
of a torch GPT (ckptlab.torch.nets, fp32, no dropout, SDPA's math attention), measured by
TorchLedger for no recompute, Korthikanti's selective (recompute(attn)) and full (every block
checkpointed), equal the model's activation term exactly, for odd and even shapes. Two
spawned gloo ranks under FSDP2 with Adam (slow): each term per rank within 5% of the model,
the differences those the table explains (FSDP's padding, Adam's step counters)."""

import pytest

torch = pytest.importorskip("torch")

from ckptlab.cluster import step_memory as sm  # noqa: E402
from ckptlab.torch import demo, fsdp, nets  # noqa: E402
from ckptlab.torch.ledger import TorchLedger  # noqa: E402

SCHEDULES = {"none": "none", "recompute(attn)": "selective", "every(1)": "full"}


@pytest.mark.parametrize("B,N,C,H,L,V", [(2, 17, 32, 2, 3, 32), (3, 16, 64, 4, 2, 50)])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_activation_term_equals_saved_bytes(B, N, C, H, L, V, schedule):
    model = nets.GPT(vocab=V, ctx=N, width=C, heads=H, layers=L, attn="math", seed=B + N)
    x, y = torch.randint(0, V, (B, N)), torch.randint(0, V, (B, N))
    led = TorchLedger(model.parameters())
    with led:
        model(x, y, schedule=schedule).backward()
    m = sm.step_memory(sm.nets_gpt(L, C, H, N, V), sm.Layout(micro_batch=B), "fp32",
                       SCHEDULES[schedule], dropout=False, ln_stats=True)
    assert led.peak == m.terms["activations"]


CFG = demo.Config(steps=1, layers=3, width=32, heads=2, seq=17, batch=4, vocab=32,
                  attn="math", schedule="every(1)")


@pytest.mark.slow
def test_fsdp_ranks_hold_what_step_memory_predicts():
    result = fsdp.run(2, CFG, optimizer="adam")
    pred = fsdp.predicted(result)
    assert set(pred) == {"params", "grads", "optimizer", "activations", "unit", "logits"}
    for r in result["ranks"]:
        for row in sm.compare(pred, fsdp.measured(r), fsdp.WHY):
            assert abs(row["rel"]) <= 0.05, row
            assert row["predicted"] == row["measured"] or row["why"], row
        for k in ("activations", "unit", "logits"):
            assert pred[k] == fsdp.measured(r)[k]
    assert "+0.00%" in fsdp.memory_table(result)


@pytest.mark.parametrize("k", [1, 2])
def test_first_k_layers_fully_recomputed(k):
    """Megatron's block method: the first k blocks checkpointed one by one, the rest kept."""
    from ckptlab.recompute.plan import Seg
    B, N, C, H, L, V = 2, 9, 32, 4, 3, 40
    model = nets.GPT(vocab=V, ctx=N, width=C, heads=H, layers=L, attn="math", seed=k)
    x, y = torch.randint(0, V, (B, N)), torch.randint(0, V, (B, N))
    led = TorchLedger(model.parameters())
    with led:
        model(x, y, schedule=[Seg([i]) for i in range(k)] + list(range(k, L))).backward()
    m = sm.step_memory(sm.nets_gpt(L, C, H, N, V), sm.Layout(micro_batch=B), "fp32", "none",
                       dropout=False, ln_stats=True, full_layers=k)
    assert led.peak == m.terms["activations"]
