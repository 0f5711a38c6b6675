"""Every figure, drawn without a display from small made-up but consistent data: the file
exists, the axes carry units, the derived title states the takeaway computed by hand."""

import numpy as np
import pytest

from ckptlab.measure import figure, plots

N = [256, 512, 1024, 2048, 4096]
MIB = 1024 * 1024


def _title(fig):
    return fig.axes[0].get_title().replace("\n", " ")


def _legend(fig):
    return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


def _saved(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    return True


def test_fit_loglog_slope():
    x = np.array([1.0, 2.0, 4.0, 8.0])
    assert plots.fit_loglog_slope(x, 3 * x**2.5) == pytest.approx(2.5)
    assert plots.fit_loglog_slope([10, 100], [7, 7]) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="equal lengths"):
        plots.fit_loglog_slope([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="positive"):
        plots.fit_loglog_slope([1, 2], [0, 1])
    with pytest.raises(ValueError, match="distinct"):
        plots.fit_loglog_slope([4, 4], [1, 2])


def test_memory_vs_n(tmp_path):
    n = np.array(N)
    # naive holds the N x N fp32 P: 4 N^2 bytes; flash holds O(N) state: 1024 N bytes.
    # At N = 4096: 4 * 4096^2 / (1024 * 4096) = 16x.
    memory = {"naive": 4 * n**2, "flash": 1024 * n}
    fig = plots.plot_memory_vs_n(n, memory, path=tmp_path / "memory.png")
    assert _saved(tmp_path / "memory.png")
    ax = fig.axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert "N" in ax.get_xlabel() and ax.get_ylabel() == "peak memory (MiB)"
    assert _legend(fig) == ["naive (slope 2.00)", "flash (slope 1.00)"]
    assert _title(fig) == "flash saves 16x peak memory vs naive at N=4096"
    assert fig.get_size_inches()[0] == 6.5


def test_time_vs_n(tmp_path):
    n = np.array(N, dtype=float)
    # naive 1e-9 N^2 s, flash 2e-7 N s: at N = 4096, 16.78 ms / 0.819 ms = 20.48 -> "20x".
    seconds = {"naive": 1e-9 * n**2, "flash": 2e-7 * n}
    fig = plots.plot_time_vs_n(n, seconds, device="A100 (modeled)", path=tmp_path / "t.png")
    assert _saved(tmp_path / "t.png")
    assert fig.axes[0].get_ylabel() == "time per call (ms)"
    assert _title(fig) == "flash is 20x faster than naive at N=4096 on A100 (modeled)"


def test_time_ticks_cover_the_data():
    """Data from 23 to 398 us: the y axis runs from the 1-2-5 tick below the smallest (20) to the
    one above the largest (500), so both ends of the data sit between labelled ticks."""
    fig = plots.plot_time_vs_n([64, 128, 256, 512], {"atomic": [23e-6, 50e-6, 120e-6, 398e-6],
                                                   "det": [30e-6, 70e-6, 160e-6, 300e-6]})
    ax = fig.axes[0]
    assert ax.get_ylim() == pytest.approx((20.0, 500.0))
    ticks = [t for t in ax.get_yticks() if 20.0 <= t <= 500.0]
    assert min(ticks) <= 23.0 and max(ticks) >= 398.0, ticks
    assert (figure.nice_below(398.0), figure.nice_above(398.0)) == (200.0, 500.0)
    assert (figure.nice_below(100.0), figure.nice_above(100.0)) == (100.0, 100.0)
    assert (figure.nice_below(0.023), figure.nice_above(0.023)) == pytest.approx((0.02, 0.05))


def test_bytes_vs_n_by_source(tmp_path):
    n = np.array(N, dtype=float)
    # counted == modeled: naive 12 N^2, flash 1024 N. measured exists only up to N = 1024:
    # naive 12.5 N^2, flash 1100 N, ratio at 1024 = 12.5 * 1024 / 1100 = 11.6 -> "12x".
    # Measured outranks counted for the title, at the largest N it covers.
    gone = [None, None]
    data = {
        "naive": {"counted": 12 * n**2, "modeled": 12 * n**2,
                  "measured": list(12.5 * n[:3] ** 2) + gone},
        "flash": {"counted": 1024 * n, "modeled": 1024 * n,
                  "measured": list(1100 * n[:3]) + gone},
    }
    fig = plots.plot_bytes_vs_n(n, data, path=tmp_path / "bytes.png")
    assert _saved(tmp_path / "bytes.png")
    assert _title(fig) == "naive moves 12x the HBM bytes of flash at N=1024 (measured)"
    assert fig.axes[0].get_ylabel() == "HBM traffic (MiB)"
    styles = {line.get_label(): line.get_linestyle() for line in fig.axes[0].get_lines()}
    assert styles["naive, counted"] == "-" and styles["flash, measured"] == "--"
    assert styles["naive, modeled"] == ":"
    # Without measured figures the title falls back to counted at the largest N: 48x.
    for m in data.values():
        del m["measured"]
    fig = plots.plot_bytes_vs_n(n, data)
    assert _title(fig) == "naive moves 48x the HBM bytes of flash at N=4096 (counted)"
    with pytest.raises(ValueError, match="estimated"):
        plots.plot_bytes_vs_n(n, {"naive": {"estimated": 12 * n**2}})


def test_roofline(tmp_path):
    # A100 fp32 ridge = 19.5e12 / 2.039e12 = 9.56 FLOP/byte. Intensities: 5.4, 270, 5.15:
    # two of three below the ridge.
    kernels = [
        {"name": "attn_naive_fwd", "flops": 2.7e8, "bytes": 5e7},
        {"name": "attn_flash_fwd", "flops": 2.7e8, "bytes": 1e6},
        {"name": "attn_naive_bwd", "flops": 6.7e8, "bytes": 1.3e8, "seconds": 1e-4},
    ]
    fig = plots.plot_roofline(kernels, "a100", path=tmp_path / "roofline.png")
    assert _saved(tmp_path / "roofline.png")
    ax = fig.axes[0]
    assert ax.get_xlabel().startswith("arithmetic intensity (FLOP/byte")
    assert ax.get_ylabel() == "performance (TFLOP/s)"
    assert _title(fig) == (
        "2 of 3 kernels are memory-bound on A100-SXM4-80GB (fp32 ridge 9.56 FLOP/byte)"
    )
    # The measured kernel sits at its achieved 6.7e8 / 1e-4 = 6.7 TFLOP/s, below the roof.
    points = {tuple(line.get_xydata()[0]) for line in ax.get_lines() if len(line.get_xydata()) == 1}
    assert any(abs(x - 6.7e8 / 1.3e8) < 1e-9 and abs(y - 6.7) < 1e-9 for x, y in points)
    with pytest.raises(ValueError, match="missing"):
        plots.plot_roofline([{"name": "k", "flops": 1}], "a100")


def test_memory_trace(tmp_path):
    # A 4-layer chain, in MiB: store-all peaks at 4; the checkpointed one at 3 (step 4, the
    # recompute). 4 / 3 = 1.33 -> "1.3x less".
    ckpt = [m * MIB for m in [1, 1, 2, 2, 3, 3, 2, 2, 1, 0]]
    store_all = [m * MIB for m in [1, 2, 3, 4, 4, 3, 2, 1]]
    phases = [(0, 4, "forward"), (4, 6, "recompute"), (6, 10, "backward")]
    fig = plots.plot_memory_trace({"sqrt(L)": ckpt, "store-all": store_all}, phases,
                                  path=tmp_path / "trace.png")
    assert _saved(tmp_path / "trace.png")
    assert fig.axes[0].get_ylabel() == "memory held (MiB)"
    assert _title(fig) == "sqrt(L) peaks at 3 MiB vs 4 MiB for store-all (1.3x less)"
    assert "recompute (sqrt(L))" in _legend(fig)
    # no line wears a phase band's colour (the second line was the recompute band's orange)
    from matplotlib.colors import same_color
    lines = [line.get_color() for line in fig.axes[0].lines]
    assert len(lines) == 2 and not any(same_color(c, p) for c in lines
                                       for p in plots.PHASE_COLOR.values()), lines
    fig = plots.plot_memory_trace({"sqrt(L)": ckpt}, phases)
    assert _title(fig) == "sqrt(L) peaks at 3 MiB at event 4, during the recompute"
    # on the FLOP clock the title says the peak in work done, the figure's own x axis (it said
    # "step 129" under an axis of MFLOPs)
    clock = [k * 1e6 for k in range(len(ckpt))]
    fig = plots.plot_memory_trace({"sqrt(L)": ckpt}, phases, clocks={"sqrt(L)": clock})
    assert _title(fig) == "sqrt(L) peaks at 3 MiB after 4 MFLOP of work, during the recompute"
    assert "step" not in _title(fig)
    with pytest.raises(ValueError, match="phases"):
        plots.plot_memory_trace({"sqrt(L)": ckpt}, [(0, 11, "forward")])
    with pytest.raises(ValueError, match="kind"):
        plots.plot_memory_trace({"sqrt(L)": ckpt}, [(0, 4, "sideways")])


def test_pareto(tmp_path):
    # "worse" (4 MiB, 6 GFLOP) is beaten by sqrt(L) (3 MiB, 2 GFLOP) on both counts.
    schedules = [
        {"name": "store-all", "peak_bytes": 8 * MIB, "recompute_flops": 0.0},
        {"name": "sqrt(L)", "peak_bytes": 3 * MIB, "recompute_flops": 2e9},
        {"name": "revolve-2", "peak_bytes": 2 * MIB, "recompute_flops": 5e9},
        {"name": "worse", "peak_bytes": 4 * MIB, "recompute_flops": 6e9},
    ]
    points = [(s["recompute_flops"], s["peak_bytes"]) for s in schedules]
    assert plots.pareto_front(points) == [0, 1, 2]
    fig = plots.plot_pareto(schedules, path=tmp_path / "pareto.png")
    assert _saved(tmp_path / "pareto.png")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "recompute FLOPs per training step (GFLOP)"
    assert ax.get_ylabel() == "peak activation memory (MiB)"
    assert _title(fig) == (
        "3 of 4 schedules are Pareto-optimal; revolve-2 holds least (2 MiB) for 5 GFLOP of "
        "recompute"
    )


def test_a_single_method_and_a_single_n(tmp_path):
    fig = plots.plot_memory_vs_n([1024], {"flash": [3 * MIB]}, what="bytes saved for backward")
    assert _title(fig) == "flash holds 3 MiB of bytes saved for backward at N=1024"
    assert _legend(fig) == ["flash"]


def test_bad_series_are_refused():
    with pytest.raises(ValueError, match="one per N"):
        plots.plot_memory_vs_n(N, {"naive": [1, 2, 3]})
    with pytest.raises(ValueError, match="positive"):
        plots.plot_time_vs_n(N, {"naive": [0, 1, 2, 3, 4]})
    with pytest.raises(ValueError, match="non-empty dict"):
        plots.plot_memory_vs_n(N, {})
