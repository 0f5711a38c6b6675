"""python -m ckptlab plan: one case worked by hand (GPT-2 small, micro-batch 16, one 24 GiB
RTX 4090, bf16 with fp32 master weights and Adam), the choice of the least recompute, the
GPT-3 worked example, and bad input refused in one line."""

import json

import pytest

from ckptlab.cli import main as cli
from ckptlab.cli import plan

GIB = 1024**3


def run(*argv):
    return cli.main(list(argv))


def test_gpt2_small_on_one_24gb_card_by_hand(capsys):
    L, h, a, s, b = 12, 768, 12, 1024, 16
    V = 50304  # 50257 padded to a multiple of 128 (Megatron's vocabulary padding, t = 1)
    psi = L * (12 * h * h + 13 * h) + V * h + s * h + 2 * h  # tied head
    states = (2 + 2 + 12) * psi  # ZeRO's 16 bytes a parameter
    sbh = s * b * h
    whole = sbh * (34 + 5 * a * s // h)  # Korthikanti, no recompute, 16-bit
    embed, head = 8 * s * b + 8 * s, 4 * sbh + 4 * s * b * V + 8 * s * b + 4
    logits_grad = 4 * s * b * V
    keep_all = states + embed + L * whole + head + logits_grad
    assert keep_all > 24 * GIB  # keeping everything does not fit ...
    layer0 = states + embed + 2 * sbh + (L - 1) * whole + head + logits_grad
    assert layer0 <= 24 * GIB  # ... recomputing layer 0 whole does
    fwd = 24 * b * s * h * h + 4 * b * s * s * h
    flash = L * 2 * b * s * s * h  # FlashAttention's S = Q K^T in every layer: more FLOPs
    assert fwd < flash

    chosen, rows = plan.plan(plan.MODELS["gpt2-small"], 1, "4090", 24 * GIB, micro_batch=b)
    assert (chosen.base, chosen.full) == ("none", 1)
    assert chosen.peak == layer0
    assert chosen.recompute_flops == fwd
    assert chosen.compute_s == pytest.approx((3 * L * fwd + fwd + 6 * s * b * h * V) / 165.2e12)
    assert chosen.tp_comm_s == chosen.dp_comm_s == 0
    assert run("plan", "--model", "gpt2-small", "--gpu", "4090", "--memory-gb", "24",
               "--micro-batch", "16") == 0
    out = capsys.readouterr().out
    assert f"peak per GPU {layer0 / GIB:.2f} GiB" in out and "layer 0 whole" in out


def test_more_memory_means_less_recompute():
    model = plan.MODELS["gpt2-small"]
    costs = [plan.plan(model, 1, "4090", gb * GIB, micro_batch=16)[0].recompute_flops
             for gb in (12, 14, 16, 20, 24, 40)]
    assert costs == sorted(costs, reverse=True) and costs[-1] == 0 < costs[0]


def test_gpt3_on_1024_a100s(capsys):
    assert run("plan", "--model", "gpt3-175b", "--gpu", "a100", "--gpus", "1024",
               "--memory-gb", "80", "--batch", "1536") == 0
    out = capsys.readouterr().out
    assert "chosen: t=8" in out  # 175B does not fit on fewer tensor-parallel ranks unsharded
    assert "does not fit: needs" in out and "largest term" in out
    # on 64 GPUs nothing fits: the model states alone are 16 x 175e9 / 64 = 41 GiB with ZeRO-3
    assert run("plan", "--model", "gpt3-175b", "--gpu", "a100", "--gpus", "8",
               "--memory-gb", "80") == 1
    assert "NOTHING FITS" in capsys.readouterr().out


def test_hf_gpt2_config_file(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(model_type="gpt2", n_layer=12, n_embd=768, n_head=12,
                                   n_positions=1024, vocab_size=50257)))
    assert plan.hf_config(cfg) == plan.MODELS["gpt2-small"]
    (tmp_path / "llama.json").write_text(json.dumps(dict(model_type="llama")))
    assert run("plan", "--hf-config", str(tmp_path / "llama.json"), "--memory-gb", "24") == 2
    assert "only GPT-2" in capsys.readouterr().err


@pytest.mark.parametrize("argv,msg", [
    (["--model", "gpt5"], "--model: expected one of"),
    (["--gpu", "v100"], "unknown device"),
    (["--memory-gb", "0"], "--memory-gb: expected a positive number"),
    (["--model", "gpt:2,10,3,4,5"], "heads must divide h"),
])
def test_bad_input_is_one_line(argv, msg, capsys):
    args = ["plan", *argv] + ([] if "--memory-gb" in argv else ["--memory-gb", "24"])
    assert run(*args) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and "\n" not in err
