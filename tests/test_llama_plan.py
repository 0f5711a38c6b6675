"""The Llama layer on paper (ckptlab.cluster.llama_layer) in the step models and the planner:
its parameters and FLOPs from the published shapes, the bytes it keeps term by term, grouped-
query attention and SwiGLU where they differ from GPT's layer, and plan on a config.json."""

import json
from pathlib import Path

import pytest

from ckptlab.cli import main as cli
from ckptlab.cli import plan
from ckptlab.cluster import planner, step_time
from ckptlab.cluster import step_memory as sm
from ckptlab.cluster.llama_layer import LlamaShape

GIB = 2**30


def run(*argv):
    return cli.main(list(argv))
CONFIG = Path(__file__).parent / "data" / "llama3_8b_config.json"
L8 = plan.MODELS["llama3-8b"]


def test_published_parameter_counts():
    """Meta's model cards: Llama 3 8B 8.03B, 70B 70.6B, 405B 405.9B parameters (untied)."""
    assert L8.params() == 8_030_261_248
    assert round(plan.MODELS["llama3-70b"].params() / 1e9, 1) == 70.6
    assert round(plan.MODELS["llama3-405b"].params() / 1e9, 1) == 405.9
    # tensor parallel: the matrices split, the two RMSNorm weights replicated
    h, kvd, f = 4096, 8 * 128, 14336
    assert L8.layer_params(4) == (2 * h * h + 2 * h * kvd + 3 * h * f) // 4 + 2 * h
    # the head is its own matrix: a tied one would drop V h from a single-stage model
    tied = LlamaShape(32, 4096, 32, 8, 14336, 8192, 128256, tied=True)
    assert L8.params() - tied.params() == 128256 * 4096


def test_flops_are_two_per_weight_and_token_plus_the_attention_core():
    b, s = 2, L8.seq
    weights = L8.layer_params() - 2 * L8.hidden  # the matrices, not the norms
    assert L8.layer_forward_flops(b) == 2 * b * s * weights + 4 * b * s * s * L8.hidden
    assert L8.step_flops(b) == 3 * (L8.layers * L8.layer_forward_flops(b)
                                    + 2 * b * s * L8.hidden * L8.vocab)
    assert step_time.model_flops(L8, b) == L8.step_flops(b)


def test_saved_bytes_term_by_term():
    """4 s b h replicated (the two RMSNorms' inputs and outputs), Q and O, K and V at the
    key/value heads' width, 4 s b f of SwiGLU, the probabilities with standard attention."""
    m = LlamaShape(2, 64, 4, 2, 96, 16, 100)
    s, b, h, a, kvd, f, w = 16, 3, 64, 4, 2 * 16, 96, 2
    base = 4 * w * s * b * h + w * s * b * (2 * h + 2 * kvd + 4 * f)
    assert m.layer_activations(b, "selective") == base
    assert m.layer_activations(b, "none") == base + w * a * s * s * b
    assert m.layer_activations(b, "flash") == base + 4 * a * s * b
    assert m.layer_activations(b, "full") == w * s * b * h
    assert m.layer_activations(b, "none", ln_stats=True) == base + w * a * s * s * b + 8 * s * b
    # tensor and sequence parallel: everything split over t
    assert m.layer_activations(b, "selective", t=2, sp=True) == base // 2
    # grouped-query attention keeps less than multi-head: K and V at 2 of 4 heads
    mha = LlamaShape(2, 64, 4, 4, 96, 16, 100)
    assert mha.layer_activations(b, "selective") - base == 2 * w * s * b * (h - kvd)


def test_step_memory_and_time_run_a_llama_and_refuse_a_split_of_its_kv_heads():
    lay = sm.Layout(dp=8, zero=3)
    mem = sm.step_memory(L8, lay, recompute="selective", micro_batches=1)
    assert mem.terms["params"] == -(-L8.params() * 2 // 8)
    assert mem.transients["fsdp units"] == L8.layer_params() * (2 * 2 + 2)
    st = step_time.step_time(L8, lay, "h100", recompute="selective")
    assert st.step_s > 0
    with pytest.raises(ValueError, match="tp = 16 must divide the 8 key/value heads"):
        sm.step_memory(L8, sm.Layout(tp=16))
    # no dropout in the layer: asking for it changes nothing
    assert sm.step_memory(L8, lay, dropout=True).peak == sm.step_memory(L8, lay,
                                                                       dropout=False).peak


def test_plan_hf_llama_config(capsys):
    assert plan.hf_config(CONFIG) == L8
    assert run("plan", "--hf-config", str(CONFIG), "--gpu", "h100", "--gpus", "8",
               "--memory-gb", "80", "--batch", "32") == 0
    out = capsys.readouterr().out
    assert "plan: Llama L=32 h=4096 a=32 kv=8 ffn=14336" in out and "chosen:" in out


@pytest.mark.parametrize("change,msg", [
    (dict(num_key_value_heads=5), "num_key_value_heads = 5 must divide"),
    (dict(hidden_act="gelu"), "only SwiGLU"),
    (dict(num_local_experts=8), "num_local_experts = 8"),
    (dict(intermediate_size=0), "intermediate_size must be a positive integer"),
    (dict(model_type="mixtral"), "model_type 'mixtral'"),
])
def test_hf_llama_config_is_checked(tmp_path, capsys, change, msg):
    cfg = dict(json.loads(CONFIG.read_text()), **change)
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    assert run("plan", "--hf-config", str(tmp_path / "c.json"), "--memory-gb", "80") == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and "\n" not in err


def test_405b_plans_on_h100s_with_meta_s_uneven_pipeline_among_the_layouts():
    chosen, rows = planner.plan(plan.MODELS["llama3-405b"], 8192, "h100", 80 * GIB, 2048)
    assert chosen is not None
    # 126 layers do not divide over 16 stages: the first and last stages hold 7, the others 8
    meta = [o for lay, o in rows if (lay.tp, lay.pp) == (8, 16) and isinstance(o,
                                                                       planner.Option)]
    assert meta
