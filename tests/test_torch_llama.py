"""The small Llama in torch (ckptlab.torch.llama) against the cluster's Llama layer
(ckptlab.cluster.llama_layer, via ckptlab.torch.llama_bytes): what each block saves, measured
by TorchLedger, equals the shape's bytes for the attention it runs; the whole model on one
process; the prediction for a pipeline stage is step_memory's own for that stage of the
planner's split. Spawned gloo ranks (slow): each FSDP2 rank and each pipeline stage (uneven
splits included) saves what is predicted, exactly."""

import pytest

torch = pytest.importorskip("torch")

from ckptlab.cluster import step_memory as sm  # noqa: E402
from ckptlab.torch import llama_bytes, llama_ranks  # noqa: E402
from ckptlab.torch import pipeline as torch_pipeline  # noqa: E402
from ckptlab.torch.ledger import TorchLedger  # noqa: E402
from ckptlab.torch.llama import Llama, LlamaConfig  # noqa: E402


@pytest.mark.parametrize("attn", ["sdpa", "math"])
def test_each_block_saves_what_the_layer_model_says(attn):
    cfg = LlamaConfig(attn=attn, layers=2)
    model = Llama(cfg)
    x = torch.randn(3, cfg.seq, cfg.width, requires_grad=True)
    shape = llama_bytes.shape_of(cfg)
    for n in (1, 2):
        led = TorchLedger(model.parameters())
        with led:
            y = x
            for blk in model.blocks[:n]:
                y = blk(y, model.cos, model.sin)
        assert led.peak == n * llama_bytes.layer_bytes(cfg, 3) + shape.rope_saved()


def test_gqa_and_swiglu_are_what_the_bytes_say():
    """K and V at 2 of 4 heads: 2 x 4 s b (h - g d) bytes fewer than multi-head attention; a
    wider SwiGLU: 4 x 4 s b more a unit of width (the four f-sized tensors it keeps)."""
    base = LlamaConfig(attn="math")
    mha = LlamaConfig(attn="math", kv_heads=4)
    wide = LlamaConfig(attn="math", ffn=49)
    s, b, h = base.seq, 3, base.width
    assert llama_bytes.layer_bytes(mha, b) - llama_bytes.layer_bytes(base, b) == \
        2 * 4 * s * b * (h - 2 * h // 4)
    assert llama_bytes.layer_bytes(wide, b) - llama_bytes.layer_bytes(base, b) == 4 * 4 * s * b


@pytest.mark.parametrize("attn", ["sdpa", "math"])
def test_the_whole_model_on_one_process(attn):
    r = llama_ranks.one_process(LlamaConfig(attn=attn, layers=3), 4)
    assert r["saved"] == r["predicted"]


def test_a_stage_s_prediction_is_step_memory_s():
    """For every stage of 5 layers over 3 (torchtitan's split 2, 2, 1), 1F1B with m = 4, the
    closed form the torch runs are held against is step_memory's activations term for that
    stage (fp32, the standard attention, the norms' rstd counted), micro-batches their own."""
    cfg = LlamaConfig(attn="math", layers=5)
    shape, p, m, b = llama_bytes.shape_of(cfg), 3, 4, 2
    for i, blocks in enumerate(torch_pipeline.split_layers(cfg.layers, p)):
        mem = sm.step_memory(shape, sm.Layout(pp=p, micro_batch=b), "fp32", "none",
                             dropout=False, ln_stats=True, micro_batches=m, stage=i)
        held = torch_pipeline.in_flight("1f1b", i, p, m)
        assert llama_bytes.stage_bytes(cfg, b, blocks, i == 0, i == p - 1, held) == \
            mem.terms["activations"]


@pytest.mark.slow
def test_fsdp2_ranks_save_what_is_predicted():
    ranks = llama_ranks.fsdp_run(2, LlamaConfig(attn="sdpa", layers=3), 4)
    assert [r["saved"] for r in ranks] == [r["predicted"] for r in ranks]


@pytest.mark.slow
def test_uneven_pipeline_stages_save_what_is_predicted():
    """4 layers over 3 stages: 1, 2, 1 (the first and last lighter by the embedding and the
    head), each rank its stage under torch's 1F1B, 4 micro-batches."""
    ranks = llama_ranks.pipeline_run(3, LlamaConfig(attn="math", layers=4), 8, 4)
    assert [len(r["blocks"]) for r in ranks] == [1, 2, 1]
    assert [r["in_flight"] for r in ranks] == [3, 2, 1]
    assert [r["saved"] for r in ranks] == [r["predicted"] for r in ranks]
