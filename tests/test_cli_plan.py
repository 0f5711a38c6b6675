"""python -m ckptlab plan: the plan chosen by modeled step time. GPT-2 small on one 24 GiB RTX
4090 worked by hand (PyTorch's loss holds two fp32 logits-sized buffers, so keeping every
activation and recomputing layer 0 whole needs 25.8 GiB; FlashAttention fits, and is faster by
the lab's own rule); GPT-3 175B on 1024 A100s never slower than the published layouts; layouts
a node's t cannot split; and bad input refused in one line, before any work."""

import json
import time

import pytest

from ckptlab.cli import main as cli
from ckptlab.cli import plan
from ckptlab.cluster import plan_compare, planner, step_time
from ckptlab.cluster import step_memory as sm

GIB = 1024**3


def run(*argv):
    return cli.main(list(argv))


def test_gpt2_small_on_one_24gb_card_by_hand(capsys):
    L, h, a, s, b = 12, 768, 12, 1024, 16
    V = 50304  # 50257 padded to a multiple of 128 (Megatron's vocabulary padding, t = 1)
    psi = L * (12 * h * h + 13 * h) + V * h + s * h + 2 * h  # tied head
    states = (2 + 2 + 12) * psi  # ZeRO's 16 bytes a parameter
    sbh = s * b * h
    whole = sbh * (34 + 5 * a * s // h)  # Korthikanti, no recompute, 16-bit, with dropout
    embed = 8 * s * b + 8 * s + sbh  # int64 ids, the embedding dropout's mask
    head = 4 * sbh + 4 * s * b * V + 8 * s * b + 4  # LN in/out, fp32 log-softmax, targets
    loss_backward = 2 * 4 * s * b * V  # nll_loss_backward's and _log_softmax's fp32 buffers
    layer0 = states + embed + 2 * sbh + (L - 1) * whole + head + loss_backward
    assert layer0 / GIB == pytest.approx(25.84, abs=0.01)  # did fit with one buffer counted
    assert layer0 - 4 * s * b * V <= 24 * GIB < layer0
    flash = 34 * sbh + 4 * a * s * b  # FlashAttention keeps L (fp32) beside the 34 s b h
    flash_peak = states + embed + L * flash + max(head, 4 * sbh + 4 * a * s * b) + loss_backward
    assert flash_peak / GIB == pytest.approx(15.91, abs=0.01)

    chosen, rows = plan.plan(plan.MODELS["gpt2-small"], 1, "4090", 24 * GIB, micro_batch=b)
    assert (chosen.base, chosen.full) == ("flash", 0)
    assert chosen.peak == flash_peak
    assert chosen.recompute_flops == L * 2 * b * s * s * h  # S = Q K^T in every layer
    keep = planner.evaluate(plan.MODELS["gpt2-small"], chosen.layout, 1, "4090", 24 * GIB,
                            base="none")
    assert keep.full == 3 and keep.step_s > chosen.step_s  # it fits only with 3 layers whole
    assert run("plan", "--model", "gpt2-small", "--gpu", "4090", "--memory-gb", "24",
               "--micro-batch", "16") == 0
    out = capsys.readouterr().out
    assert f"peak per GPU {flash_peak / GIB:.2f} GiB" in out and "FlashAttention" in out
    assert "two more fp32 logits-sized buffers" in out  # the loss it assumes, named
    # Megatron's fused loss writes in place (its only transient: the 16-bit copy, 2 s b V):
    # everything can be kept
    fused = planner.evaluate(plan.MODELS["gpt2-small"], chosen.layout, 1, "4090", 24 * GIB,
                             loss="fused", base="none")
    assert fused.full == 0
    assert fused.memory.transients["loss backward"] == 2 * s * b * V


def test_more_memory_never_means_a_slower_plan():
    model = plan.MODELS["gpt2-small"]
    times = [plan.plan(model, 1, "4090", gb * GIB, micro_batch=16)[0].step_s
             for gb in (12, 14, 16, 20, 24, 40)]
    assert times == sorted(times, reverse=True)


def test_gpt3_on_1024_a100s_beats_the_published_layouts(capsys):
    model = plan.MODELS["gpt3-175b"]
    chosen, rows = plan.plan(model, 1024, "a100", 80 * GIB, batch=1536)
    assert chosen is not None and chosen.peak <= 80 * GIB
    fits = [o for _, o in rows if isinstance(o, plan.Option)]
    assert chosen.step_s == min(o.step_s for o in fits)
    # Megatron-LM's example script (t 8, p 16, micro-batch 1) and Korthikanti's t 8, p 8: both
    # among the layouts tried, neither faster by the model than the plan
    for t, p in ((8, 16), (8, 8)):
        tried = [o for lay, o in rows if (lay.tp, lay.pp) == (t, p)]
        assert tried, (t, p)
        fits = [o for o in tried if isinstance(o, plan.Option)]
        assert fits and min(o.step_s for o in fits) >= chosen.step_s
    second = plan_compare.runner_up(chosen, rows)
    assert second.step_s >= chosen.step_s and planner.family(second.layout) != \
        planner.family(chosen.layout)
    assert run("plan", "--model", "gpt3-175b", "--gpu", "a100", "--gpus", "1024",
               "--memory-gb", "80", "--batch", "1536", "--compare", "8,16") == 0
    out = capsys.readouterr().out
    assert "chosen: t=" in out and "runner-up:" in out and "it loses on" in out
    assert "your layout: t=8 +SP p=16" in out or "your layout: t=8 p=16" in out
    # on 8 GPUs nothing fits: the model states alone are 16 x 175e9 / 8 > 80 GiB
    assert run("plan", "--model", "gpt3-175b", "--gpu", "a100", "--gpus", "8",
               "--memory-gb", "80") == 1
    assert "NOTHING FITS" in capsys.readouterr().out


def test_heads_a_node_cannot_split():
    """GPT-2 small has 12 heads: on 8 GPUs t = 8 cannot split them; the plan uses t <= 4."""
    chosen, rows = plan.plan(plan.MODELS["gpt2-small"], 8, "a100", 80 * GIB, batch=64)
    assert chosen is not None
    assert {lay.tp for lay, _ in rows} == {1, 2, 4}


def test_a_batch_no_layout_divides_says_so(capsys):
    """1 layer (p = 1), 12 heads (t <= 4): d is 8, 4 or 2, and the batch of 3 divides none of
    them. Not a memory problem."""
    assert run("plan", "--model", "gpt:1,768,12,1024,50257", "--gpus", "8", "--batch", "3",
               "--memory-gb", "80") == 1
    out = capsys.readouterr().out
    assert "the batch 3 divides no layout" in out and "more memory" not in out
    # GPT-2 small (12 layers) does split 3 sequences: t = 4 x p = 2, d = 1, 3 micro-batches
    chosen, _ = plan.plan(plan.MODELS["gpt2-small"], 8, "a100", 80 * GIB, batch=3)
    assert chosen.layout.dp == 1 and chosen.micro_batches * chosen.layout.micro_batch == 3


def test_hf_gpt2_config_file(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(model_type="gpt2", n_layer=12, n_embd=768, n_head=12,
                                   n_positions=1024, vocab_size=50257)))
    assert plan.hf_config(cfg) == plan.MODELS["gpt2-small"]
    (tmp_path / "moe.json").write_text(json.dumps(dict(model_type="mixtral")))
    assert run("plan", "--hf-config", str(tmp_path / "moe.json"), "--memory-gb", "24") == 2
    assert "model_type 'mixtral': only GPT-2's layer" in capsys.readouterr().err


GOOD = dict(model_type="gpt2", n_layer=12, n_embd=768, n_head=12, n_positions=1024,
            vocab_size=50257)


@pytest.mark.parametrize("content,msg", [
    ([1, 2], "expected a JSON object"), ("gpt2", "expected a JSON object"),
    (dict(GOOD, n_head=0), "n_head must be a positive integer"),
    (dict(GOOD, n_head=7), "n_head = 7 must divide n_embd = 768"),
    (dict(GOOD, n_layer=-3), "n_layer must be a positive integer"),
    (dict(GOOD, n_layer=0), "n_layer must be a positive integer"),
    (dict(GOOD, n_layer=12.5), "n_layer must be a positive integer"),
    (dict(GOOD, n_layer="12"), "n_layer must be a positive integer"),
    (dict(GOOD, n_layer=True), "n_layer must be a positive integer"),
    (dict(GOOD, vocab_size=float("nan")), "vocab_size must be a positive integer"),
    (dict(GOOD, n_positions=None), "no 'n_positions'"),
    (dict(GOOD, tie_word_embeddings="yes"), "tie_word_embeddings must be true or false"),
    (dict(GOOD, n_layer=10**5), "layers = 100000 is more than the planner models"),
    (dict(GOOD, n_layer=10**23), "is more than the planner models"),
    (dict(GOOD, n_embd=12, n_head=12), "head dim h / a = 1"),
])
def test_hf_config_values_are_checked(tmp_path, capsys, content, msg):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(content))
    start = time.perf_counter()
    assert run("plan", "--hf-config", str(cfg), "--memory-gb", "24", "--gpus", "1024") == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and "\n" not in err and "Traceback" not in err
    assert time.perf_counter() - start < 5  # refused before any search


@pytest.mark.parametrize("argv,msg", [
    (["--model", "gpt5"], "--model: expected one of"),
    (["--gpu", "v100"], "unknown device"),
    (["--gpu", "t4"], "no interconnect figures"),
    (["--memory-gb", "0"], "--memory-gb"),
    (["--memory-gb", "inf"], "--memory-gb"),
    (["--memory-gb", "nan"], "--memory-gb"),
    (["--gpus", "100000000000000000000"], "gpus = 100000000000000000000 is more than"),
    (["--gpus", "1e20"], "--gpus"),
    (["--batch", "0"], "--batch"),
    (["--model", "gpt:2,10,3,4,5"], "heads must divide h"),
    (["--model", "gpt:0,768,12,1024,50257"], "sizes must be positive"),
    (["--model", "gpt:100000,768,12,1024,50257", "--gpus", "1024"], "layers = 100000"),
    (["--model", "gpt:100000000000000000000000,768,12,1024,50257"], "12 digits or more"),
    (["--model", "gpt:2,8,2,4,16"], "head dim h / a = 4"),
    (["--model", "gpt:2,12,1,8,16"], "head dim h / a = 12: the attention time model"),
    (["--achievable", "0"], "--achievable"), (["--achievable", "1.5"], "--achievable"),
    (["--achievable", "nan"], "--achievable"),
    (["--compare", "8"], "--compare: expected T,P"),
    (["--loss", "mse"], "--loss"), (["--recipe", "fp8"], "--recipe"),
])
def test_bad_input_is_one_line(argv, msg, capsys):
    args = ["plan", *argv] + ([] if "--memory-gb" in argv else ["--memory-gb", "24"])
    start = time.perf_counter()
    assert run(*args) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and "\n" not in err
    assert time.perf_counter() - start < 5  # refused before any search


def test_a_layout_of_your_own_that_is_not_one(capsys):
    assert run("plan", "--model", "gpt2-small", "--gpus", "8", "--batch", "64",
               "--memory-gb", "80", "--compare", "8,1") == 0
    assert "your layout: t=8 p=1: does not fit: t = 8, p = 1 is not a layout" in \
        capsys.readouterr().out


def test_the_planner_accepts_its_limits_and_no_more():
    big = sm.GPTShape(planner.LIMITS["layers"], 128, 1, 16, 16)
    planner.check_limits(big, 1)
    with pytest.raises(ValueError, match="more than the planner models"):
        planner.check_limits(sm.GPTShape(planner.LIMITS["layers"] + 1, 128, 1, 16, 16), 1)
    assert plan.step_time is step_time


def test_pruning_loses_neither_the_plan_nor_the_runner_up():
    """The planner skips layouts whose matmuls alone outlast the second-best family's step;
    evaluating every layout gives the same plan and runner-up."""
    model = sm.GPTShape(8, 512, 8, 512, 4096)
    chosen, rows = planner.plan(model, 16, "a100", 8 * GIB, batch=32)
    every = []
    for lay, m in planner.layouts(model, 16, "a100", 32):
        if not isinstance(m, str):
            opt = planner.best_option(model, lay, m, "a100", 8 * GIB)
            if opt is not None:
                every.append((lay, opt))
    assert any(planner.is_pruned(o) for _, o in rows)  # it prunes
    best = min((o for _, o in every), key=lambda o: (o.step_s, o.peak))
    assert (chosen.layout, chosen.step_s) == (best.layout, best.step_s)
    assert plan_compare.runner_up(chosen, rows).step_s == plan_compare.runner_up(best, every).step_s
