"""Model states in host memory (ckptlab.cluster.zero_offload): what stays on the GPU and what
the host holds, worked by hand in bytes; the transfers and the CPU step in seconds; the planner
offloads only where nothing fits without, and says why when the host is too small."""

import pytest

from ckptlab.cli import main as cli
from ckptlab.cli import plan
from ckptlab.cluster import planner, step_time
from ckptlab.cluster import step_memory as sm
from ckptlab.cluster import zero_offload as zo
from ckptlab.cluster.llama_layer import LlamaShape
from ckptlab.cluster.model_shape import Layout

GIB = 2**30
SMALL = LlamaShape(2, 64, 4, 2, 96, 16, 100)  # h 64, 4 heads of 16, 2 kv heads, ffn 96, V 100
# by hand: a layer wq, wo 64^2 each, wk, wv 64 x 32, three 64 x 96, two norms of 64
LAYER = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 96 + 2 * 64
PSI = 2 * LAYER + 100 * 64 + 64 + 100 * 64  # + embedding, final norm, untied head
L8 = plan.MODELS["llama3-8b"]


def run(*argv):
    return cli.main(list(argv))


def test_what_stays_on_the_gpu_by_hand():
    assert LAYER == 30848 and SMALL.params() == PSI == 74560
    rec = sm.recipe_of("bf16")
    # the bucket is at most every parameter (a small model: all its gradients at once)
    assert zo.gpu_states(SMALL, Layout(offload="optimizer"), rec) == {
        "params": 2 * PSI, "grad bucket": 2 * PSI}
    # at least the largest parameter, the vocabulary's 128256 x 4096 > 5e8 elements
    assert zo.gpu_states(L8, Layout(offload="optimizer"), rec)["grad bucket"] == \
        2 * 128256 * 4096
    # else DeepSpeed's reduce_bucket_size, 5e8 elements (a 32k vocabulary: 131M)
    l2 = LlamaShape(32, 4096, 32, 32, 11008, 4096, 32000)
    assert zo.gpu_states(l2, Layout(offload="optimizer"), rec)["grad bucket"] == 2 * 500_000_000
    # "params": the largest unit (the head, V h / t at t = 2) and the 5e7 prefetch bucket
    assert zo.gpu_states(L8, Layout(tp=2, offload="params"), rec)["params"] == \
        2 * (128256 * 4096 // 2 + 50_000_000)


def test_host_memory_by_hand():
    rec = sm.recipe_of("bf16")
    opt = zo.host_bytes(SMALL, Layout(offload="optimizer"), rec)
    assert opt == {"master + optimizer": 12 * PSI, "fp32 grads": 4 * PSI,
                   "pinned buckets": 2 * 2 * PSI}
    par = zo.host_bytes(SMALL, Layout(offload="params"), rec)
    assert sum(par.values()) == 16 * PSI + 2 * PSI + 4 * PSI
    # Llama 3 8B: 16 bytes a parameter is 119.7 GiB before the buckets
    assert sum(zo.host_bytes(L8, Layout(offload="optimizer"), rec).values()) == \
        16 * 8_030_261_248 + 4 * 128256 * 4096


def test_step_memory_swaps_the_model_states_and_keeps_the_rest():
    kw = dict(recompute="selective", micro_batches=2)
    base = sm.step_memory(SMALL, Layout(), "bf16", **kw)
    off = sm.step_memory(SMALL, Layout(offload="optimizer"), "bf16", **kw)
    assert base.terms == {"params": 2 * PSI, "grads": 2 * PSI, "optimizer": 12 * PSI,
                          "activations": off.terms["activations"]}
    assert off.terms == {"params": 2 * PSI, "grad bucket": 2 * PSI,
                         "activations": base.terms["activations"]}
    assert off.transients == base.transients
    assert base.peak - off.peak == 12 * PSI


def test_transfers_and_cpu_step_by_hand():
    rec = sm.recipe_of("bf16")
    link = 25e9  # RTX 4090's host link as measured (PCIe 4.0 x16)
    assert zo.host_link("RTX-4090") == pytest.approx(link, rel=1e-12)
    host = 2 * 4800e6 * 8  # two channels of DDR5-4800
    down, cpu = 2 * PSI / link, 30 * PSI / host
    fwd, bwd, m = 1e-6, 2e-6, 3  # the copies (5.96 us) exceed both
    got = zo.time_terms(SMALL, Layout(offload="optimizer"), rec, "RTX-4090", m, fwd, bwd)
    assert got == pytest.approx(dict(pcie_down=m * (down - bwd), pcie_params=0.0,
                                     cpu_adam=cpu, pcie_up=2 * PSI / link), rel=1e-12)
    got = zo.time_terms(SMALL, Layout(offload="params"), rec, "RTX-4090", m, fwd, bwd)
    assert got == pytest.approx(dict(pcie_down=0.0, pcie_params=m * (down - fwd + down - bwd),
                                     cpu_adam=cpu, pcie_up=0.0), rel=1e-12)
    # hidden behind a long enough backward; the delayed update hides the CPU step too
    slow = zo.time_terms(SMALL, Layout(offload="optimizer"), rec, "RTX-4090", m, 1.0, 2.0,
                         delayed=True)
    assert slow == dict(pcie_down=0.0, pcie_params=0.0, cpu_adam=0.0, pcie_up=0.0)
    # eight GPUs of a node share its memory: eight times the CPU step
    eight = zo.time_terms(SMALL, Layout(offload="optimizer"), rec, "H100-SXM5-80GB", 1, 1.0,
                          2.0, sharing=8)
    assert eight["cpu_adam"] == pytest.approx(8 * 30 * PSI / (16 * 4800e6 * 8), rel=1e-12)


def test_step_time_moves_the_optimizer_to_the_cpu():
    args = ("RTX-4090", "bf16", "selective", 0, 2)
    base = step_time.step_time(SMALL, Layout(), *args)
    off = step_time.step_time(SMALL, Layout(offload="optimizer"), *args)
    assert off.terms["optimizer"] == 0.0 and base.terms["optimizer"] > 0
    added = sum(off.terms[k] for k in ("pcie_down", "pcie_params", "cpu_adam", "pcie_up"))
    assert off.step_s == pytest.approx(base.step_s - base.terms["optimizer"] + added,
                                       rel=1e-12)


def test_offload_is_refused_where_it_is_not_modeled():
    with pytest.raises(ValueError, match="offload: expected"):
        Layout(offload="nvme")
    with pytest.raises(ValueError, match="one data-parallel rank"):
        sm.step_memory(SMALL, Layout(dp=2, offload="optimizer"), "bf16")


def test_llama3_8b_on_one_24gb_card_offloads(capsys):
    """Nothing fits the GPU alone; with the host's 160 GiB the parameters stream over PCIe."""
    argv = ("plan", "--hf-config", "tests/data/llama3_8b_config.json", "--gpu", "4090",
            "--gpus", "1", "--memory-gb", "24", "--batch", "8")
    assert run(*argv, "--host-memory-gb", "160") == 0
    out = capsys.readouterr().out
    assert "nothing fits the GPU alone" in out
    assert "chosen: t=1 d=1 offload params" in out
    assert "host memory 136.6 GiB of 160" in out and "CPU Adam 8.03B parameters" in out
    assert "gradients down 0.642 s a micro-batch" in out and "(hidden)" in out  # 16 GB / 25
    chosen, _ = planner.plan(L8, 1, "4090", 24 * GIB, 8, offload="auto", host_memory=160 * GIB)
    assert chosen.layout.offload == "params" and chosen.peak <= 24 * GIB
    assert chosen.time.terms["cpu_adam"] > 0


def test_too_little_host_memory_is_refused_with_the_reason(capsys):
    argv = ("plan", "--hf-config", "tests/data/llama3_8b_config.json", "--gpu", "4090",
            "--gpus", "1", "--memory-gb", "24", "--batch", "8")
    assert run(*argv) == 1  # the default 64 GiB
    out = capsys.readouterr().out
    assert "need more host memory than given" in out
    assert ("offload optimizer      does not fit: host memory: offloading the optimizer needs "
            "121.6 GiB of host memory a GPU, more than the 64 GiB given") in out
    assert run(*argv, "--offload", "none") == 1
    assert "offload" not in capsys.readouterr().out.split("NOTHING FITS")[1]


@pytest.mark.parametrize("argv", [
    ("--model", "gpt2-small", "--gpu", "4090", "--gpus", "1", "--memory-gb", "24",
     "--micro-batch", "16"),
    ("--model", "gpt3-175b", "--gpu", "a100", "--gpus", "1024", "--memory-gb", "80",
     "--batch", "1536"),
])
def test_plans_that_fit_without_offload_are_unchanged(argv, capsys):
    assert run("plan", *argv) == 0
    auto = capsys.readouterr().out
    assert run("plan", *argv, "--offload", "none") == 0
    assert capsys.readouterr().out == auto
    assert "offload" not in auto


def test_forced_offload_on_one_gpu():
    chosen, rows = planner.plan(plan.MODELS["gpt2-small"], 1, "4090", 24 * GIB,
                                micro_batch=16, offload="optimizer")
    assert chosen.layout.offload == "optimizer"
    assert all(lay.offload == "optimizer" for lay, _ in rows)
    with pytest.raises(ValueError, match="offload: expected"):
        planner.plan(plan.MODELS["gpt2-small"], 1, "4090", 24 * GIB, offload="disk")


def test_forced_offload_where_it_is_not_modeled_says_so(capsys):
    assert run("plan", "--model", "gpt3-175b", "--gpu", "a100", "--gpus", "1024",
               "--memory-gb", "80", "--batch", "1536", "--offload", "optimizer") == 1
    assert "NOTHING FITS: offload is modeled for one data-parallel rank and one pipeline " \
        "stage" in capsys.readouterr().out
