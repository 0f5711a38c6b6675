"""Figures a learner can read: point labels that never overlap or leave the axes (the Pareto
plots, memory against step time, the roofline), the legend listing only what is drawn, titles
without an orphaned word, µs and MiB units, plain log tick labels."""

import numpy as np
import pytest

from ckptlab.measure import figure, plots
from ckptlab.recompute import schedules

MIB = 2**20


def lab10_points():
    """The points lab 10 draws: its GPT's profile, every schedule and the DP at five budgets."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "labs" / "solutions" / \
        "10_schedules_and_budgets.py"
    spec = importlib.util.spec_from_file_location("sol10", path)
    sol = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sol)
    prof = sol.notebook_profile()
    specs = ["none", "sqrt", "every(1)", "every(2)", "every(4)", "chen_greedy(25%)",
             "chen_greedy(30%)", "revolve(2)", "revolve(3)", "keep(matmul)",
             "recompute(attn)"] + [f"optimal({b}%)" for b in (20, 30, 40, 50, 60, 80)]
    out = []
    for s in specs:
        p = schedules.make(s, prof=prof).predict(prof)
        out.append(dict(name=s, peak_bytes=p.peak_bytes, recompute_flops=p.recompute_flops))
    return out


# Crowded cases: labels on top of each other, one at the top, one at the edge.
CROWDED = [dict(name="none", peak_bytes=40 * MIB, recompute_flops=0),
           dict(name="every(2)", peak_bytes=20 * MIB, recompute_flops=1.0e9),
           dict(name="chen_greedy(25%)", peak_bytes=20.2 * MIB, recompute_flops=1.01e9),
           dict(name="optimal(20%)", peak_bytes=8 * MIB, recompute_flops=2.0e9),
           dict(name="every(1)", peak_bytes=8.1 * MIB, recompute_flops=2.0e9),
           dict(name="revolve(2)", peak_bytes=5 * MIB, recompute_flops=6.0e9)]


def test_the_check_sees_overlaps_and_clipping():
    """label_problems must be able to fail: labels written where they fall, unmoved."""
    fig, ax = figure._new_axes()
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 10)
    ax.text(5, 5, "every(2)")
    ax.text(5.05, 5.05, "chen_greedy(25%)")
    ax.text(9.9, 9.9, "revolve(2)")
    problems = figure.label_problems(fig)
    assert "'every(2)' overlaps 'chen_greedy(25%)'" in problems
    assert "'revolve(2)' leaves the axes" in problems


@pytest.mark.parametrize("points", [CROWDED, "lab10"], ids=["crowded", "lab10"])
def test_pareto_labels_neither_overlap_nor_clip(points, tmp_path):
    points = lab10_points() if points == "lab10" else points
    fig = plots.plot_pareto(points, path=tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 5000
    assert figure.label_problems(fig) == []
    assert sorted(t.get_text() for t in fig.axes[0].texts) == sorted(p["name"] for p in points)


def test_memory_vs_time_draws_the_spread_and_labels_cleanly():
    pts = [dict(name=p["name"], peak_bytes=p["peak_bytes"],
                seconds=1e-3 * (1 + k % 3), q1_s=1e-3 * (0.9 + k % 3), q3_s=1e-3 * (1.2 + k % 3))
           for k, p in enumerate(CROWDED)]
    fig = plots.plot_memory_vs_time(pts, device="cpu")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "time per training step on cpu (ms)"
    assert ax.get_ylabel() == "peak activation memory (MiB)"
    assert figure.label_problems(fig) == []
    # every point's bar spans its IQR: 0.9 .. 1.2 ms for the first
    bars = [c for c in ax.collections if len(c.get_segments())]
    spans = sorted(tuple(np.round(seg[:, 0], 6)) for c in bars for seg in c.get_segments())
    assert (0.9, 1.2) in spans
    with pytest.raises(ValueError, match="q1_s <= seconds"):
        plots.plot_memory_vs_time([dict(name="x", peak_bytes=1, seconds=1.0, q1_s=2.0)])


def test_memory_vs_time_frontier_only_where_the_iqrs_separate():
    """Medians alone put 'every(2)' on the frontier; its IQR (86-168 ms) overlaps its
    neighbours', so no line may order it. A schedule beaten beyond the noise (more memory, and
    its whole IQR after another's) is grey; one whose IQR overlaps a leaner one's stays blue."""
    MS = 1e-3
    pts = [dict(name="none", peak_bytes=40 * MIB, seconds=60 * MS, q1_s=55 * MS, q3_s=65 * MS),
           dict(name="every(2)", peak_bytes=20 * MIB, seconds=120 * MS, q1_s=86 * MS,
                q3_s=168 * MS),
           dict(name="every(1)", peak_bytes=10 * MIB, seconds=150 * MS, q1_s=140 * MS,
                q3_s=160 * MS),
           dict(name="slow", peak_bytes=30 * MIB, seconds=300 * MS, q1_s=290 * MS,
                q3_s=310 * MS),
           dict(name="near", peak_bytes=12 * MIB, seconds=149 * MS, q1_s=145 * MS,
                q3_s=170 * MS)]
    lo = [p["q1_s"] for p in pts]
    hi = [p["q3_s"] for p in pts]
    ys = [p["peak_bytes"] for p in pts]
    # 'slow' is beaten for sure by every(1); 'near' overlaps every(1)'s IQR: not for sure
    assert plots.pareto_front_with_spread(lo, hi, ys) == [0, 1, 2, 4]
    assert plots.pareto_front([(p["seconds"], p["peak_bytes"]) for p in pts]) == [0, 1, 2, 4]
    fig = plots.plot_memory_vs_time(pts, device="cpu")
    ax = fig.axes[0]
    # the line runs through every point of the medians' front, none -> every(2) -> near ->
    # every(1): solid where the IQRs are apart (65 < 86 ms), dotted where they overlap
    steps = [(np.round(np.asarray(line.get_xdata(), dtype=float), 3).tolist(),
              line.get_linestyle()) for line in ax.lines if line.get_drawstyle() == "steps-post"]
    assert steps == [([60.0, 120.0], "-"), ([120.0, 149.0], ":"), ([149.0, 150.0], ":")], steps
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "Pareto frontier (medians; IQRs apart)" in legend
    assert "its order within the noise (IQRs overlap)" in legend
    assert "no fastest beyond the noise" not in fig.axes[0].get_title()  # none's IQR is apart
    assert "none is fastest" in fig.axes[0].get_title().replace("\n", " ")
    assert figure.label_problems(fig) == []


def test_the_frontier_skips_no_pareto_point_and_names_a_fastest_only_apart():
    """Lab 10's measured step times: a frontier line that left out a Pareto point (its IQR
    overlapped a neighbour's) and a title naming a 'fastest' schedule whose IQR overlapped the
    next one's, so that two runs named two different ones."""
    MS = 1e-3
    pts = [dict(name="none", peak_bytes=40 * MIB, seconds=26 * MS, q1_s=25 * MS, q3_s=28 * MS),
           dict(name="recompute(attn)", peak_bytes=36 * MIB, seconds=27 * MS, q1_s=25.5 * MS,
                q3_s=28.5 * MS),
           dict(name="optimal(40%)", peak_bytes=12 * MIB, seconds=36 * MS, q1_s=34 * MS,
                q3_s=38 * MS),
           dict(name="sqrt", peak_bytes=15 * MIB, seconds=38 * MS, q1_s=37 * MS, q3_s=40 * MS),
           dict(name="revolve(2)", peak_bytes=6 * MIB, seconds=49 * MS, q1_s=47 * MS,
                q3_s=51 * MS)]
    fig = plots.plot_memory_vs_time(pts, device="cpu")
    ax = fig.axes[0]
    through = {round(x, 3) for line in ax.lines if line.get_drawstyle() == "steps-post"
               for x in np.asarray(line.get_xdata(), dtype=float)}
    front = plots.pareto_front([(p["seconds"] / MS, p["peak_bytes"]) for p in pts])
    assert through == {round(pts[i]["seconds"] / MS, 3) for i in front} == {26, 27, 36, 49}
    title = ax.get_title().replace("\n", " ")
    assert "no fastest beyond the noise: none, recompute(attn)" in title, title


def test_a_weakly_dominated_point_is_not_drawn_pareto_optimal():
    """Lab 13's offload figure: keeping everything (256 GiB) takes as long as offloading over
    NVLink-C2C (10 GiB): it is beaten, weakly, and must be grey, off the frontier."""
    fig = plots.plot_memory_vs_time(OFFLOAD, device="H100 (modeled)", log_memory=True)
    ax = fig.axes[0]
    lo = hi = [p["seconds"] for p in OFFLOAD]
    front = plots.pareto_front_with_spread(lo, hi, [p["peak_bytes"] for p in OFFLOAD])
    names = [OFFLOAD[i]["name"] for i in front]
    assert "recompute none" not in names and "offload, C2C" in names, names
    from matplotlib.colors import to_rgb

    drawn = {(round(float(np.ravel(line.get_xdata())[0]), 2),
              round(float(np.ravel(line.get_ydata())[0]), 1)): to_rgb(line.get_color())
             for line in ax.lines if line.get_marker() == "o" and len(np.ravel(line.get_xdata()))}
    assert drawn[2.22, 256.5] == to_rgb("0.6"), drawn  # recompute none: grey
    assert drawn[2.22, 9.8] == to_rgb("C0")  # offload over C2C: on the frontier
    assert drawn[8.59, 9.8] == to_rgb("0.6")  # over PCIe 5: full recompute beats it


def test_checkpointing_faster_than_none_says_why():
    """bench checkpoint measured optimal(40%) faster than none, IQRs apart, and greyed none
    out with no word of why: the note names the allocator's peaks, or load."""
    from ckptlab.measure import tradeoff

    MS = 1e-3
    base = dict(name="none", peak_bytes=40 * MIB, seconds=30 * MS, q1_s=29 * MS, q3_s=31 * MS,
                alloc_bytes=90 * MIB)
    quick = dict(name="optimal(40%)", peak_bytes=16 * MIB, seconds=25 * MS, q1_s=24 * MS,
                 q3_s=26 * MS, alloc_bytes=50 * MIB)
    note = tradeoff.faster_than_baseline([base, quick])
    assert "optimal(40%) measured faster than none" in note and "50 MiB" in note and \
        "90 MiB" in note and "allocate" in note, note
    assert "likely load" in tradeoff.faster_than_baseline([base, dict(quick, alloc_bytes=95 * MIB)])
    assert "likely load" in tradeoff.faster_than_baseline(
        [{k: v for k, v in p.items() if k != "alloc_bytes"} for p in (base, quick)])
    assert tradeoff.faster_than_baseline([base, dict(quick, q3_s=29.5 * MS)]) == ""  # overlap
    fig = plots.plot_memory_vs_time([base, quick], device="cpu")
    assert "measured faster than none" in fig.axes[0].get_title().replace("\n", " ")


def test_roofline_legend_lists_only_what_is_drawn():
    kernels = [dict(name="naive (5 kernels)", flops=4e9, bytes=3e9),
               dict(name="flash (2 kernels)", flops=5e9, bytes=1e9)]
    fig = plots.plot_roofline(kernels, "A100")
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert not any("measured" in t for t in legend)
    assert any("modeled" in t for t in legend)
    assert "both kernels" in fig.axes[0].get_title()
    assert figure.label_problems(fig) == []
    fig = plots.plot_roofline([dict(kernels[0], seconds=1e-3)], "A100")
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend[-1] == "achieved (measured time)" and not any("modeled" in t for t in legend)


def test_titles_wrap_without_an_orphan_word():
    title = ("at N=1024, memory-bound on A100-SXM4-80GB (fp32 ridge 9.56 FLOP/byte): naive")
    lines = figure.wrap_title(title).split("\n")
    assert len(lines) == 2 and min(len(x) for x in lines) > 20, lines
    assert figure.wrap_title("short") == "short"


def test_units_are_micro_seconds_and_mebibytes_with_plain_ticks():
    n = [64, 128, 256]
    fig = plots.plot_time_vs_n(n, {"a": [2e-6, 4e-6, 9e-6]})
    assert fig.axes[0].get_ylabel() == "time per call (µs)"
    fig.canvas.draw()
    ticks = [t.get_text() for t in fig.axes[0].get_yticklabels() if t.get_text()]
    assert ticks and not any("10^" in t or "times" in t for t in ticks), ticks
    from ckptlab.cli.report import fmt_bytes, fmt_seconds

    assert fmt_bytes(48.5 * MIB) == "48.5 MiB" and fmt_seconds(3e-6) == "3 µs"


# GPT-3 175B on an H100 as lab 13 draws it (held GiB, modeled step s): points far apart on a log
# axis, three at nearly the same time, under a two-line title.
GIB = 2**30
OFFLOAD = [dict(name="recompute none", peak_bytes=256.5 * GIB, seconds=2.220),
           dict(name="recompute selective", peak_bytes=76.5 * GIB, seconds=2.240),
           dict(name="recompute full", peak_bytes=4.5 * GIB, seconds=2.960),
           dict(name="offload, PCIe 4", peak_bytes=9.8 * GIB, seconds=17.18),
           dict(name="offload, PCIe 5", peak_bytes=9.8 * GIB, seconds=8.59),
           dict(name="offload, C2C", peak_bytes=9.8 * GIB, seconds=2.220)]


def test_leader_lines_end_at_their_points():
    """Each label's line runs from the label to its own point: no line ends in empty space (a
    retry of the placement once joined labels to where they stood before it), and none is
    left over from an earlier pass."""
    fig = plots.plot_memory_vs_time(OFFLOAD, device="H100 (modeled)", log_memory=True,
                                    title="GPT-3 175B: offload over NVLink-C2C hides behind "
                                    "compute; over PCIe it costs more than full recompute")
    ax = fig.axes[0]
    assert figure.label_problems(fig) == []
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    points = {p["name"]: ax.transData.transform((p["seconds"], p["peak_bytes"] / GIB))
              for p in OFFLOAD}
    lines = [p for p in ax.patches if type(p).__name__ == "FancyArrowPatch"]
    assert len(lines) <= len(OFFLOAD)
    ends = [ax.transData.transform(line.get_path().vertices[[0, -1]]) for line in lines]
    for text in ax.texts:
        box = text.get_window_extent(renderer).expanded(1.0, 1.0)
        point = points[text.get_text()]
        near = np.hypot(point[0] - np.clip(point[0], box.x0, box.x1),
                        point[1] - np.clip(point[1], box.y0, box.y1)) < 12  # px
        joined = any(min(np.hypot(*(e - point)) for e in pair) < 6 and
                     min(np.hypot(*(e - np.array([np.clip(e[0], box.x0, box.x1),
                                                   np.clip(e[1], box.y0, box.y1)])))
                         for e in pair) < 6 for pair in ends)
        assert near or joined, f"{text.get_text()!r} is neither at its point nor joined to it"


def test_gain_bands_are_in_the_legend():
    """Lab 08's recompute gain against d: each shaded band (unique to counted bytes) is named
    in the legend beside its line."""
    ds = [16, 32, 64, 128]
    gains = {"A100 fp32": ([0.83, 0.86, 0.86, 0.86], [0.83, 0.86, 0.86, 1.0]),
             "A100 bf16": ([5.2, 2.8, 1.46, 0.94], [2.08, 1.59, 1.29, 1.07])}
    fig = plots.plot_gain_vs_d(ds, gains)
    ax = fig.axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    for label in gains:
        assert f"{label}: unique to counted bytes" in legend and f"{label} (unique bytes)" in legend
    bands = [c for c in ax.collections if c.get_label() in legend]
    assert len(bands) == 2
    assert [t.get_text() for t in ax.get_xticklabels()] == ["16", "32", "64", "128"]
    with pytest.raises(ValueError, match="expected 4 values"):
        plots.plot_gain_vs_d(ds, {"x": ([1, 2], [1, 2])})


def test_gain_figure_marks_each_rule_where_its_line_crosses_one():
    """Lab 08's figure: bf16 on an A100 and fp32 on an L4 (modeled), each with its rule 2 R / 3
    drawn in its colour; the modeled gain is above 1 at the head dim below the rule and below 1
    at the one above, so the reader sees the line cross where the rule says."""
    from ckptlab.measure import crossing

    ds = (32, 64, 96, 128)
    gains, rules = {}, {}
    for gpu, dtype in (("A100", "bf16"), ("L4", "fp32")):
        rows = sorted(crossing.recompute_gains([gpu], [dtype], ds, N=4096, B=1, H=16),
                      key=lambda r: r["d"])
        label = f"{gpu} {dtype}"
        gains[label] = ([r["gain_unique"] for r in rows], [r["gain_counted"] for r in rows])
        rules[label] = rows[0]["rule_of_thumb_d"]
        below = max(d for d in ds if d < rules[label])
        above = min(d for d in ds if d > rules[label])
        g = dict(zip(ds, gains[label][0], strict=True))
        assert g[below] > 1 > g[above], (label, rules[label], g)
    fig = plots.plot_gain_vs_d(ds, gains, rules=rules)
    ax = fig.axes[0]
    verticals = {round(float(line.get_xdata()[0]), 1): line.get_label() for line in ax.lines
                 if len(set(np.ravel(line.get_xdata()))) == 1}
    assert sorted(verticals) == sorted(round(r, 1) for r in rules.values()), verticals
    assert all("2 R / 3" in label for label in verticals.values())
    with pytest.raises(ValueError, match="no gains"):
        plots.plot_gain_vs_d(ds, gains, rules={"H100 bf16": 197.0})
