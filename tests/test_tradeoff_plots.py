"""The memory-against-speed figure, drawn without a display from made-up but consistent data:
the file is a PNG, both panels carry units, every source of time has a legend entry, the bars
span what was given, and bad points are refused with a message."""

import numpy as np
import pytest

from ckptlab.measure import figure, tradeoff_plots

MIB = 1024 * 1024
POINTS = [
    dict(name="naive", memory_bytes=64 * MIB, flops=12e9,
         times={"A100 (modeled)": (2e-3, 6e-3), "measured": (7e-3, 8e-3, 9e-3)}),
    dict(name="stored", memory_bytes=64 * MIB, flops=12e9,
         times={"A100 (modeled)": (1e-3, 1.5e-3)}),
    dict(name="flash", memory_bytes=0.5 * MIB, flops=14e9,
         times={"A100 (modeled)": (1.1e-3, 1.3e-3)}),
]


def test_memory_vs_speed(tmp_path):
    path = tmp_path / "m.png"
    fig = tradeoff_plots.plot_memory_vs_speed(POINTS, path=path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    ax_t, ax_f = fig.axes
    assert ax_t.get_xlabel().startswith("time (ms)") and "(MiB)" in ax_t.get_ylabel()
    assert ax_f.get_xlabel().startswith("hardware FLOPs (GFLOP)")
    assert [t.get_text() for t in ax_t.get_legend().get_texts()] == ["A100 (modeled)",
                                                                     "measured"]
    # the modeled bar of naive spans 2-6 ms at 64 MiB; the measured one 7-9 ms about 8 ms
    spans = []
    for coll in ax_t.collections:
        for seg in coll.get_segments():
            spans.append((round(seg[0][0], 6), round(seg[1][0], 6), round(seg[0][1], 6)))
    assert (2.0, 6.0, 64.0) in spans and (7.0, 9.0, 64.0) in spans
    # the derived title names the method that holds least
    assert fig._suptitle.get_text().startswith("flash holds least (512 KiB)")
    xs = sorted(float(np.ravel(line.get_xdata())[0]) for line in ax_f.lines)
    assert xs == [12.0, 12.0, 14.0]


def test_names_never_overlap_and_the_time_axis_says_where_times_come_from():
    """naive and stored hold the same memory at the same FLOPs (their names fell on each other);
    a figure of modeled times only must not say 'measured' on its axis."""
    fig = tradeoff_plots.plot_memory_vs_speed(POINTS)
    assert figure.label_problems(fig) == []
    assert sorted(t.get_text() for t in fig.axes[1].texts) == ["flash", "naive", "stored"]
    assert "modeled lower-upper, measured p10-p90" in fig.axes[0].get_xlabel()
    modeled = [dict(p, times={"A100 (modeled)": p["times"]["A100 (modeled)"]}) for p in POINTS]
    label = tradeoff_plots.plot_memory_vs_speed(modeled).axes[0].get_xlabel()
    assert "modeled" in label and "measured" not in label, label
    measured = [dict(p, times={"measured": (1e-3, 2e-3, 3e-3)}) for p in POINTS]
    label = tradeoff_plots.plot_memory_vs_speed(measured).axes[0].get_xlabel()
    assert "measured" in label and "modeled" not in label, label


@pytest.mark.parametrize("bad,message", [
    ([], "expected dicts"),
    ([dict(name="x", memory_bytes=1, flops=1)], "missing"),
    ([dict(name="x", memory_bytes=0, flops=1, times={})], "positive"),
    ([dict(name="x", memory_bytes=1, flops=1, times={"m": (2.0, 1.0)})], "ordered"),
    ([dict(name="x", memory_bytes=1, flops=1, times={"m": (1.0,)})], "lower, upper"),
])
def test_bad_points_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        tradeoff_plots.plot_memory_vs_speed(bad)
