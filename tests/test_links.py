"""The links as deployed (ckptlab.cluster.links), ZeRO-3 by implementation
(ckptlab.cluster.zero3), the A100 40GB, and the plan's tie within the model's error."""

import pytest

from ckptlab.cli import main as cli
from ckptlab.cluster import links, plan_compare, planner, step_time, zero3
from ckptlab.cluster import step_memory as sm
from ckptlab.measure import roofline

GIB = 2**30


def test_every_link_runs_below_its_datasheet_with_a_measurement():
    for name, f in links.FABRICS.items():
        assert 0 < f.nvlink_achieved < 1 and 0 < f.nic_achieved < 1, name
        assert f.sources and all("issue #" in s for s in f.sources), name
    a100 = links.FABRICS["A100-SXM4-80GB"]
    assert a100.intra == pytest.approx(230e9) and a100.inter == pytest.approx(24e9)
    assert roofline.spec("a100-40gb")["hbm_bytes_per_s"] == 1555e9
    assert step_time.links("a100-40gb") == step_time.links("a100")


def test_a_group_inside_a_node_never_touches_the_network():
    f = links.FABRICS["A100-SXM4-80GB"]
    assert links.collective_s(f, "all-reduce", 8e9, 8, 1) == pytest.approx(2 * 7 / 8 * 8e9 /
                                                                           f.intra)
    # 32 ranks, one a GPU: 8 a node reduce-scatter over NVLink, 4 nodes over the 8 NICs
    want = 2 * (7 / 8 * 8e9 / f.intra + 3 / 4 * 1e9 / f.inter)
    assert links.collective_s(f, "all-reduce", 8e9, 32, 1) == pytest.approx(want)
    # t = 8: every member on its own node, one NIC's share each
    assert links.collective_s(f, "all-reduce", 8e9, 4, 8) == pytest.approx(
        2 * 3 / 4 * 8e9 / f.inter)
    with pytest.raises(ValueError, match="kind"):
        links.collective_s(f, "broadcast", 1, 2)


def test_the_1_7b_run_plans_pure_data_parallelism():
    """Narayanan's 1.7B on 32 A100s (4 nodes), every option open: data-parallel traffic among
    a node's 8 GPUs goes over NVLink and the 4 nodes share 8 NICs each, so t = 1 (as the run
    went) beats t = 2 (which one NIC's 25 GB/s per GPU for all of it made faster)."""
    model = sm.GPTShape(24, 2304, 24, 2048, 51200)
    chosen, _ = planner.plan(model, 32, "a100", 80 * GIB, 512, recipe="bf16", loss="fused",
                             overlap_dp=False)
    assert chosen.layout.tp == 1 and chosen.layout.pp == 1 and chosen.layout.dp == 32


def test_deepspeed_prefetch_bucket_exposes_more_than_fsdp_for_wide_layers():
    """A layer with more parameters than DeepSpeed's prefetch bucket (5e7) gathers part of
    itself on demand; FSDP prefetches the whole next layer. Memory: FSDP two layers and a
    layer's gradients; DeepSpeed a layer plus the bucket and its reduce bucket."""
    big = sm.GPTShape(8, 8192, 64, 2048, 50304)  # 805M parameters a layer
    st = {impl: step_time.step_time(big, sm.Layout(dp=16, zero=3, zero3=impl), "a100",
                                    "bf16", "flash", micro_batches=2)
          for impl in zero3.IMPLEMENTATIONS}
    assert st["deepspeed"].terms["dp_exposed"] > st["fsdp"].terms["dp_exposed"]
    layer = big.layer_params()
    assert zero3.overlapped("deepspeed", layer) == pytest.approx(5e7 / layer)
    mem = {impl: sm.step_memory(big, sm.Layout(dp=16, zero=3, zero3=impl), "bf16", "flash",
                                micro_batches=2).transients for impl in zero3.IMPLEMENTATIONS}
    assert mem["fsdp"]["fsdp units"] == layer * 6
    assert mem["deepspeed"]["zero-3 buckets"] == (layer + 5e7) * 2 + 5e8 * 2
    with pytest.raises(ValueError, match="zero3"):
        sm.Layout(dp=2, zero=3, zero3="megatron")


def test_the_plan_reports_a_tie_within_the_models_error(capsys):
    assert cli.main(["plan", "--model", "gpt3-175b", "--gpus", "1024", "--memory-gb", "80",
                     "--batch", "1536"]) == 0
    out = capsys.readouterr().out
    assert "a tie:" in out and f"({plan_compare.MODEL_ERROR:.1%}" in out
    assert "links: DGX A100, 8 GPUs a node: 230 GB/s a GPU inside it (77% of 300)" in out
    assert cli.main(["plan", "--model", "gpt2-small", "--gpu", "4090", "--memory-gb", "24",
                     "--micro-batch", "16", "--zero3", "deepspeed"]) == 0
    assert "a decision: no other layout" in capsys.readouterr().out
    assert cli.main(["plan", "--memory-gb", "24", "--zero3", "megatron"]) == 2


def test_zero3_exposure_by_hand():
    """Per micro-batch, n = 4 layers: the first gathers wait; a layer's gather hides behind
    the compute before it when shorter (FSDP, one unit ahead), the excess shows; DeepSpeed's
    prefetch bucket lets only q of it run ahead."""
    g, r, f, b = 2.0, 1.0, 3.0, 2.5  # a layer's gather, reduce-scatter, forward, backward
    fsdp = zero3.exposed_s("fsdp", 4, 10**7, g, r, 0.5, 0.25, 4 * f, 4 * b)
    assert fsdp == pytest.approx(0.5 + g + 3 * 0 + 4 * (g + r - b) + 0.25)
    q = 5e7 / 1e8
    ds = zero3.exposed_s("deepspeed", 4, 10**8, g, r, 0.5, 0.25, 4 * f, 4 * b)
    assert ds == pytest.approx(0.5 + g + 3 * (1 - q) * g + 4 * ((1 - q) * g + max(
        0, q * g + r - b)) + 0.25)
    assert zero3.exposed_s("fsdp", 4, 10**7, g, r, 0.5, 0.25, 0, 0) == pytest.approx(
        0.5 + 0.25 + 8 * g + 4 * r)  # nothing to hide behind: every byte waits
