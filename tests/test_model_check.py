"""`bench model-check`: the time model beside the FlashAttention papers' A100 numbers. The
published numbers carry their sources; FA2's FLOP count by hand; the modeled bracket holds
Fig. 2's two measured times; the achievable fraction scales compute-bound time and brings the
flash model near the published band; the command runs and refuses a bad fraction."""

import pytest

from ckptlab.cli import main as cli
from ckptlab.cli import model_check
from ckptlab.measure import published, timemodel


def test_published_numbers_say_where_they_were_printed():
    assert published.FIG2_MS == {"naive": 41.7, "flash": 7.3}
    assert "2205.14135" in published.FIG2_SOURCE and "Fig. 2" in published.FIG2_SOURCE
    assert "2307.08691" in published.FA2_FRACTION_SOURCE
    assert "abstract" in published.FA2_FRACTION_SOURCE
    assert published.FA2_FRACTION["flash"] == (0.50, 0.73)
    # 4 N^2 d H B forward, 2.5x backward, halved when causal: N 1024, d 64, 32 heads, 16 batch
    assert published.fa2_flops(1024, 64, 32, 16, False) == 3.5 * 4 * 1024**2 * 64 * 32 * 16
    assert published.fa2_flops(1024, 64, 32, 16, True) == 3.5 * 2 * 1024**2 * 64 * 32 * 16


def test_fig2_times_lie_in_the_modeled_bracket():
    rows = {r["method"]: r for r in model_check.fig2_rows()}
    for method, ms in published.FIG2_MS.items():
        r = rows[method]
        assert r["modeled_lo_ms"] < ms < r["modeled_hi_ms"] and r["inside"], r
    assert rows["naive"]["what_if"] and not rows["flash"]["what_if"]
    # the roofline (F = 1) is too fast for flash: 7.3 ms published against ~3.6 ms modeled
    assert not rows["flash"]["within"]
    fit = {r["method"]: r for r in model_check.fig2_rows(model_check.ACHIEVABLE)}
    assert fit["flash"]["within"]


def test_achievable_fraction_scales_compute_bound_launches():
    kt = timemodel.method_time("flash", 4, 32, 4096, 4096, 64, "a100", dtype="fp16")
    kt6 = timemodel.method_time("flash", 4, 32, 4096, 4096, 64, "a100", dtype="fp16",
                                achievable=0.5)
    for a, b in zip(kt.launches["unique"], kt6.launches["unique"], strict=True):
        assert b.compute_s == pytest.approx(a.compute_s / 0.5) and b.memory_s == a.memory_s
    with pytest.raises(ValueError, match="achievable"):
        timemodel.method_time("flash", 1, 1, 64, 64, 64, "a100", dtype="fp16", achievable=1.5)


def test_fa2_rows_against_the_band(monkeypatch):
    monkeypatch.setitem(published.FA2_GRID, "lengths", (1024, 16384))
    monkeypatch.setitem(published.FA2_GRID, "dims", (64,))
    rows = model_check.fa2_rows()
    assert len(rows) == 4
    for r in rows:
        assert (r["published_tflops_lo"], r["published_tflops_hi"]) == pytest.approx((156, 227.76))
        assert r["modeled_tflops_counted"] < r["published_tflops_lo"]  # no cache: too slow
        assert r["modeled_tflops_unique"] > r["published_tflops_lo"] and r["inside"]
        assert r["B"] * r["N"] == 16384 and r["H"] * r["d"] == 2048
    fit = model_check.fa2_rows(model_check.ACHIEVABLE)
    assert all(r["within"] for r in fit)
    assert not all(r["within"] for r in rows)  # the roofline alone is too fast


def test_model_check_command(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(published.FA2_GRID, "lengths", (2048,))
    png = tmp_path / "mc.png"
    assert cli.main(["bench", "model-check", "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "41.7 ms" in out and "2307.08691" in out and "Left out of the model" in out
    assert png.stat().st_size > 10_000
    assert cli.main(["bench", "model-check", "--achievable", "0"]) == 2
    assert "--achievable" in capsys.readouterr().err
