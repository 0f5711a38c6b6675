"""CPU offload modeled beside recompute (ckptlab.cluster.offload), against hand arithmetic
from the sources' numbers: PCIe 16 or 32 GT/s x 16 lanes with 128b/130b encoding, NVLink-C2C
450 GB/s a direction, the H100's 989.5 TFLOP/s dense BF16, Korthikanti's per-layer bytes."""

import pytest

from ckptlab.cluster import offload

GPT3 = dict(s=2048, b=1, h=12288, a=96)
FWD_FLOPS = 24 * 2048 * 12288**2 + 4 * 2048**2 * 12288  # one GPT-3 layer's forward matmuls
T_FWD = FWD_FLOPS / 989.5e12  # 7.71 ms on an H100 at peak
LAYER = 2048 * 12288 * (34 + 5 * 96 * 2048 // 12288)  # bytes, no recompute
INPUT = 2 * 2048 * 12288


def test_links_and_copy_time():
    assert offload.LINKS["PCIe 4.0 x16"] == pytest.approx(31.5e9, rel=1e-3)
    assert offload.LINKS["PCIe 5.0 x16"] == pytest.approx(63.0e9, rel=1e-3)
    assert offload.copy_seconds(63.0e9, "PCIe 5.0 x16") == pytest.approx(1.0, rel=1e-3)
    with pytest.raises(ValueError, match="link"):
        offload.copy_seconds(1, "USB")
    with pytest.raises(ValueError, match="non-negative"):
        offload.copy_seconds(-1, "PCIe 4.0 x16")


def test_layer_time_and_break_even():
    fwd, bwd = offload.layer_seconds(2048, 1, 12288)
    assert fwd == pytest.approx(T_FWD) and bwd == pytest.approx(2 * T_FWD)
    # the bytes the offload copies (the activations without the input) over the forward's
    # time: 365.6 GB/s, not 372.2 (all of the layer's activations, input included)
    be = offload.break_even_bandwidth(**GPT3)
    assert be == pytest.approx((LAYER - INPUT) / T_FWD) and be / 1e9 == pytest.approx(365.6,
                                                                                       abs=0.05)
    # one definition: at the break-even link the copy is exactly hidden, just below it is not
    moved = offload.offloaded_bytes(**GPT3)
    offload.LINKS["at break-even"] = be
    offload.LINKS["just below"] = be * 0.999
    try:
        assert offload.offload_exposed(moved, "at break-even", 2048, 1, 12288) == 0.0
        assert offload.offload_exposed(moved, "just below", 2048, 1, 12288) > 0.0
    finally:
        del offload.LINKS["at break-even"], offload.LINKS["just below"]


def test_table_at_gpt3_scale():
    rows = {r["choice"]: r for r in offload.table(**GPT3, layers=96)}
    moved = LAYER - INPUT
    pcie5 = moved / offload.LINKS["PCIe 5.0 x16"]  # 45 ms a way, beyond 7.7 / 15.4 ms
    assert rows["offload over PCIe 5.0 x16"]["extra_s"] == pytest.approx(
        96 * ((pcie5 - T_FWD) + (pcie5 - 2 * T_FWD)))
    assert rows["offload over NVLink-C2C (GH200)"]["extra_s"] == 0.0  # 6.3 ms < 7.7 ms: hidden
    assert rows["offload over NVLink-C2C (GH200)"]["held_bytes"] == 96 * INPUT + 2 * LAYER
    assert rows["recompute: selective"]["extra_s"] == pytest.approx(
        96 * 4 * 2048**2 * 12288 / 989.5e12)
    assert rows["recompute: full"]["extra_s"] == pytest.approx(96 * T_FWD)
    assert rows["recompute: none"]["held_bytes"] == 96 * LAYER
    # over PCIe, offloading everything is slower than recomputing everything
    assert rows["offload over PCIe 5.0 x16"]["step_s"] > rows["recompute: full"]["step_s"]


def test_the_labs_offload_figure_reads_cleanly():
    from ckptlab.measure import figure, plots

    rows = offload.table(**GPT3, layers=96)
    fig = plots.plot_memory_vs_time([dict(name=r["choice"], peak_bytes=r["held_bytes"],
                                          seconds=r["step_s"]) for r in rows],
                                    device="H100 (modeled)", log_memory=True)
    assert fig.axes[0].get_yscale() == "log"
    assert figure.label_problems(fig) == []
    fig.canvas.draw()
    ticks = [t.get_text() for t in fig.axes[0].get_yticklabels() if t.get_text()]
    assert ticks and not any("10^" in t or "mathdefault" in t for t in ticks), ticks
