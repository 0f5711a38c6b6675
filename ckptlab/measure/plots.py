"""The figures the labs and the command line draw. Each function takes plain data (lists, dicts,
arrays), returns a matplotlib Figure sized for a notebook (6.5 in wide) and, given `path`, saves
it as PNG. Figures are built with matplotlib.figure.Figure, never pyplot, so no display and no
global state are involved (safe on a headless machine, under the Agg backend).

Titles state the takeaway. Pass `title=` to say it yourself; otherwise it is derived from the
data ("flash saves 64x peak memory vs naive at N=4096"). Axes carry units; byte axes use binary
units (KiB, MiB, GiB), FLOP axes decimal ones (GFLOP, TFLOP/s), times s, ms, µs, ns. Point
labels are placed by adjustText so that none overlaps another or leaves the axes
(label_problems() checks a drawn figure for both).
"""

from __future__ import annotations

import numpy as np
from matplotlib.patches import Patch
from matplotlib.ticker import NullLocator

from ckptlab.measure import roofline
from ckptlab.measure.figure import (  # noqa: F401  (public here too: plots is the labs' entry)
    N_LABEL,
    SIZE_IN,
    _finish,
    _fmt,
    _n_ticks,
    _new_axes,
    _plain_log_labels,
    _positive,
    _ratio,
    _save,
    _series,
    _unit,
    label_points,
    label_problems,
    plain_log_ticks,
    wrap_title,
)
from ckptlab.measure.ncu import SOURCES
from ckptlab.measure.tradeoff import (  # noqa: F401
    pareto_front,
    pareto_front_with_spread,
    plot_memory_vs_time,
    plot_pareto,
)

# One line style per source. Counted and modeled bytes must agree exactly, so modeled is drawn
# thin and dotted with x markers on top of a wide translucent counted line: both stay visible.
SOURCE_STYLE = {"counted": "-", "unique": "-.", "measured": "--", "modeled": ":"}
_SOURCE_LOOK = {
    "counted": dict(marker="o", lw=4, alpha=0.45, zorder=2),
    "unique": dict(marker="v", lw=1.5, zorder=3),
    "measured": dict(marker="s", lw=1.5, zorder=3),
    "modeled": dict(marker="x", lw=1.5, zorder=4),
}
PHASE_COLOR = {"forward": "tab:blue", "recompute": "tab:orange", "backward": "tab:green"}
# The memory trace's lines: none of the phase colours, so no line reads as a phase band.
TRACE_COLORS = ("black", "tab:purple", "tab:red", "tab:brown", "tab:pink", "tab:olive",
                "tab:gray", "tab:cyan")


def fit_loglog_slope(x, y) -> float:
    """Least-squares slope of log y against log x: y ~ c * x^slope (2 for "grows as N^2")."""
    x, y = _positive("x", x), _positive("y", y)
    if len(x) != len(y) or len(x) < 2:
        raise ValueError(f"x, y: expected equal lengths >= 2, got {len(x)} and {len(y)}")
    if np.ptp(np.log(x)) == 0:
        raise ValueError("x: expected at least two distinct values to fit a slope")
    slope, _ = np.polyfit(np.log(x), np.log(y), 1)
    return float(slope)


def _lines_vs_n(ax, n, series: dict, kind: str, what: str) -> dict:
    """Log-log lines of series (name -> values per N) with fitted slopes in the legend."""
    if not isinstance(series, dict) or not series:
        raise ValueError(f"{what}: expected a non-empty dict name -> values, got {series!r}")
    ys = {name: _series(f"{what}[{name!r}]", v, len(n)) for name, v in series.items()}
    scale, unit = _unit(kind, max(float(y.max()) for y in ys.values()))
    for name, y in ys.items():
        label = f"{name} (slope {fit_loglog_slope(n, y):.2f})" if len(n) >= 2 else name
        ax.loglog(n, y / scale, "o-", label=label)
    _n_ticks(ax, n)
    ax.set_ylabel(f"{what} ({unit})")
    ax.legend(fontsize=9)
    return ys


# ------------------------------------------------------------------------------ figures


def plot_memory_vs_n(n, memory_by_method: dict, *, what="peak memory", title=None, path=None):
    """Memory against N on log-log axes, one line per method with its fitted slope (2 for an
    N x N matrix, 1 for O(N) state). Derived title: the saving at the largest N."""
    n = _positive("n", n)
    fig, ax = _new_axes()
    ys = _lines_vs_n(ax, n, memory_by_method, "bytes", what)
    if title is None:
        last = {name: y[-1] for name, y in ys.items()}
        lo, hi = min(last, key=last.get), max(last, key=last.get)
        if lo == hi:
            title = f"{lo} holds {_fmt('bytes', last[lo])} of {what} at N={int(n[-1])}"
        else:
            saving = _ratio(last[hi] / last[lo])
            title = f"{lo} saves {saving} {what} vs {hi} at N={int(n[-1])}"
    return _finish(fig, ax, title, path)


def plot_time_vs_n(n, seconds_by_method: dict, *, device="", title=None, path=None):
    """Time per call against N, log-log, one line per method with its fitted slope. `device`
    names where the time comes from ("cuda: NVIDIA H100", or "A100 (modeled)") and goes in
    the derived title."""
    n = _positive("n", n)
    fig, ax = _new_axes()
    ys = _lines_vs_n(ax, n, seconds_by_method, "seconds", "time per call")
    if title is None:
        last = {name: y[-1] for name, y in ys.items()}
        fast, slow = min(last, key=last.get), max(last, key=last.get)
        where = f" on {device}" if device else ""
        if fast == slow:
            title = f"{fast} takes {_fmt('seconds', last[fast])} at N={int(n[-1])}{where}"
        else:
            speedup = _ratio(last[slow] / last[fast])
            title = f"{fast} is {speedup} faster than {slow} at N={int(n[-1])}{where}"
    return _finish(fig, ax, title, path)


def plot_bytes_vs_n(n, bytes_by_method: dict, *, title=None, path=None):
    """HBM traffic against N, log-log: bytes_by_method[method][source] -> bytes per N, with
    source one of "counted", "unique", "measured", "modeled" (a line style each; a colour per
    method).
    None or NaN marks an N where a source has no figure (e.g. no ncu)."""
    n = _positive("n", n)
    if not isinstance(bytes_by_method, dict) or not bytes_by_method:
        raise ValueError(f"bytes_by_method: expected a dict method -> {{source: values}}, got "
                         f"{bytes_by_method!r}")
    ys = {}  # (method, source) -> values
    for method, by_source in bytes_by_method.items():
        for source, values in dict(by_source).items():
            if source not in SOURCES:
                raise ValueError(f"bytes_by_method[{method!r}]: source {source!r} is not one "
                                 f"of {SOURCES}")
            ys[method, source] = _series(f"bytes_by_method[{method!r}][{source!r}]", values,
                                         len(n), allow_missing=True)
    scale, unit = _unit("bytes", max(float(np.nanmax(y)) for y in ys.values()))
    fig, ax = _new_axes()
    colors = {m: f"C{k}" for k, m in enumerate(bytes_by_method)}
    for (method, source), y in ys.items():
        ax.loglog(n, y / scale, linestyle=SOURCE_STYLE[source], color=colors[method],
                  label=f"{method}, {source}", **_SOURCE_LOOK[source])
    _n_ticks(ax, n)
    ax.set_ylabel(f"HBM traffic ({unit})")
    ax.legend(fontsize=9)
    if title is None:
        title = _bytes_takeaway(n, ys, list(bytes_by_method))
    return _finish(fig, ax, title, path)


def _bytes_takeaway(n, ys: dict, methods: list) -> str:
    """At the largest N where a source has every method: who moves how many times more bytes.
    Sources are tried in the order measured, counted, modeled (the most direct first)."""
    for source in ("measured", "counted", "modeled"):
        have = [m for m in methods if (m, source) in ys]
        if len(have) < 2:
            continue
        cols = np.array([ys[m, source] for m in have])  # (methods, N)
        full = np.where(~np.isnan(cols).any(axis=0))[0]
        if full.size:
            k = full[-1]
            lo, hi = have[int(np.argmin(cols[:, k]))], have[int(np.argmax(cols[:, k]))]
            r = _ratio(cols[:, k].max() / cols[:, k].min())
            return f"{hi} moves {r} the HBM bytes of {lo} at N={int(n[k])} ({source})"
    return "HBM traffic against N"



def plot_gain_vs_d(ds, gains: dict, *, rules: dict | None = None,
                   title="above 1: recomputing S wins", path=None):
    """The recompute gain (stored time / flash time) against the head dim d: gains[label] =
    (per d from unique bytes, per d from counted), the two bounds of one modeled time. A line
    at the unique bound and a shaded band to the counted one, one colour per label, both in
    the legend; a grey line at 1 (above it recomputing wins). rules[label] = the head dim the
    rule of thumb (crossing.rule_of_thumb: 2 R / 3) predicts for that label: a dashed line in
    its colour, where the unique-bytes line should cross 1."""
    ds = _positive("ds", ds)
    if not isinstance(gains, dict) or not gains:
        raise ValueError(f"gains: expected a dict label -> (unique, counted), got {gains!r}")
    rules = dict(rules or {})
    if set(rules) - set(gains):
        raise ValueError(f"rules: labels {sorted(set(rules) - set(gains))} have no gains")
    fig, ax = _new_axes()
    for k, (label, (unique, counted)) in enumerate(gains.items()):
        lo = _series(f"gains[{label!r}] unique", unique, len(ds))
        hi = _series(f"gains[{label!r}] counted", counted, len(ds))
        ax.plot(ds, lo, "o-", color=f"C{k}", label=f"{label} (unique bytes)")
        ax.fill_between(ds, np.minimum(lo, hi), np.maximum(lo, hi), color=f"C{k}", alpha=0.2,
                        label=f"{label}: unique to counted bytes")
        if label in rules:
            ax.axvline(rules[label], color=f"C{k}", ls="--", lw=1,
                       label=f"{label}: the rule, d = 2 R / 3 = {rules[label]:.0f}")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ds, [f"{d:g}" for d in ds])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set(xlabel="head dim d", ylabel="recompute gain, stored / flash")
    ax.legend(fontsize=8)
    return _finish(fig, ax, title, path)

def plot_roofline(kernels, device, *, dtype="fp32", title=None, path=None):
    """The roofline of `device` (a roofline.SPECS name or alias) with each kernel placed at its
    arithmetic intensity. kernels: dicts with name, flops, bytes and, when measured, seconds: a
    kernel with seconds sits at its achieved FLOP/s (filled marker); one without sits on the
    roof, at its modeled best (hollow marker)."""
    spec = roofline.spec(device)
    if not kernels:
        raise ValueError("kernels: expected at least one dict with name, flops, bytes")
    pts = []
    for k, kern in enumerate(kernels):
        missing = [key for key in ("name", "flops", "bytes") if key not in kern]
        if missing:
            raise ValueError(f"kernels[{k}]: missing {missing}; expected name, flops, bytes")
        intensity = roofline.arithmetic_intensity(kern["flops"], kern["bytes"])
        if kern.get("seconds") is not None:
            if not kern["seconds"] > 0:
                raise ValueError(f"kernels[{k}]: seconds must be positive, got {kern['seconds']}")
            pts.append((kern["name"], intensity, kern["flops"] / kern["seconds"], True))
        else:
            pts.append((kern["name"], intensity, roofline.attainable_flops(intensity, spec, dtype),
                        False))
    ridge, peak = roofline.ridge_point(spec, dtype), roofline.peak_flops(spec, dtype)
    xs = [max(p[1], 1e-3) for p in pts]
    grid = np.geomspace(min(min(xs), ridge) / 4, max(max(xs), ridge) * 4, 200)  # (200,)
    scale, unit = _unit("flops", peak)
    fig, ax = _new_axes()
    roof = [roofline.attainable_flops(i, spec, dtype) / scale for i in grid]
    ax.loglog(grid, roof, "k-", lw=1.5, label=f"{spec['name']} roof ({dtype})")
    ax.axvline(ridge, color="gray", ls=":", lw=1)
    ax.annotate(f"ridge {ridge:.3g} FLOP/B", (ridge, peak / scale), textcoords="offset points",
                xytext=(4, -12), fontsize=8, color="gray")
    for _, x, y, measured in pts:
        ax.plot([max(x, 1e-3)], [y / scale], "o", ms=7, mfc="C1" if measured else "none",
                mec="C1")
    kinds = {measured for *_, measured in pts}  # the legend lists only what is drawn
    if True in kinds:
        ax.plot([], [], "o", mfc="C1", mec="C1", label="achieved (measured time)")
    if False in kinds:
        ax.plot([], [], "o", mfc="none", mec="C1", label="on the roof (modeled, not timed)")
    _plain_log_labels(ax.xaxis)
    _plain_log_labels(ax.yaxis)
    ax.set_xlabel("arithmetic intensity (FLOP/byte of HBM traffic)")
    ax.set_ylabel(f"performance ({unit}/s)")
    ax.legend(fontsize=8, loc="lower right")
    if title is None:
        below = [p[0] for p in pts if p[1] < ridge]
        who = (("the kernel is" if len(pts) == 1 else "both kernels are" if len(pts) == 2
                else f"all {len(pts)} kernels are") if len(below) == len(pts) else
               f"{len(below)} of {len(pts)} kernels are")
        title = f"{who} memory-bound on {spec['name']} ({dtype} ridge {ridge:.3g} FLOP/byte)"
    fig = _finish(fig, ax, title, None)
    label_points(ax, [max(p[1], 1e-3) for p in pts], [p[2] / scale for p in pts],
                 [p[0] for p in pts])
    return _save(fig, path)


def plot_memory_trace(traces: dict, phases, *, clocks: dict | None = None, title=None,
                      path=None):
    """Memory held after each event of a training step (forward, recompute, backward), one
    line per schedule in `traces` (name -> bytes per event). `phases` shades the first
    schedule's events: (start, end, kind) spans events start..end-1, kind forward/recompute/
    backward. `clocks` (name -> hardware FLOPs done at each event, Ledger.flops_clock) puts
    every schedule on one x axis, the work done so far, so that a schedule that recomputes
    takes visibly longer; without it the x axis is the event index of each trace alone."""
    if not isinstance(traces, dict) or not traces:
        raise ValueError(f"traces: expected a non-empty dict name -> bytes per step: {traces!r}")
    ys, xs = {}, {}
    for name, values in traces.items():
        y = np.asarray(values, dtype=np.float64)
        if y.ndim != 1 or y.size == 0 or not np.all(np.isfinite(y) & (y >= 0)):
            raise ValueError(f"traces[{name!r}]: expected non-negative bytes per step: {values}")
        ys[name] = y
        x = np.arange(len(y), dtype=np.float64) if clocks is None else np.asarray(
            clocks.get(name, ()), dtype=np.float64)
        if x.shape != y.shape or np.any(np.diff(x) < 0):
            raise ValueError(f"clocks[{name!r}]: expected {len(y)} non-decreasing values")
        xs[name] = x
    first = next(iter(ys))
    spans = _check_phases(phases, len(ys[first]))
    scale, unit = _unit("bytes", max(float(y.max()) for y in ys.values()))
    xscale, xunit = (1.0, "") if clocks is None else _unit(
        "flops", max(float(x.max()) for x in xs.values()) or 1.0)
    fig, ax = _new_axes()
    edges = np.concatenate([[0.0], xs[first]]) / xscale  # event k spans edges[k]..edges[k+1]
    for start, end, kind in spans:
        lo, hi = ((start - 0.5, end - 0.5) if clocks is None
                  else (edges[start], edges[end]))
        ax.axvspan(lo, hi, color=PHASE_COLOR[kind], alpha=0.15, lw=0)
    for k, (name, y) in enumerate(ys.items()):
        ax.step(xs[name] / xscale, y / scale, where="post" if clocks else "mid", label=name,
                color=TRACE_COLORS[k % len(TRACE_COLORS)], lw=1.6)
    handles, _ = ax.get_legend_handles_labels()
    kinds = [k for k in PHASE_COLOR if any(s[2] == k for s in spans)]
    handles += [Patch(color=PHASE_COLOR[k], alpha=0.3, label=f"{k} ({first})") for k in kinds]
    ax.legend(handles=handles, fontsize=8)
    ax.set_xlabel("event (ops in execution order)" if clocks is None else
                  f"work done so far in the step: hardware {xunit}s (forward, recompute, "
                  "backward)")
    ax.set_ylabel(f"memory held ({unit})")
    ax.set_ylim(bottom=0)
    if title is None:
        title = _trace_takeaway(ys, spans, None if clocks is None else xs)
    return _finish(fig, ax, title, path)


def _check_phases(phases, steps: int) -> list:
    spans = []
    for k, p in enumerate(phases):
        if len(p) != 3:
            raise ValueError(f"phases[{k}]: expected (start, end, kind), got {p!r}")
        start, end, kind = int(p[0]), int(p[1]), p[2]
        if kind not in PHASE_COLOR:
            raise ValueError(f"phases[{k}]: kind {kind!r} is not one of {list(PHASE_COLOR)}")
        if not 0 <= start < end <= steps:
            raise ValueError(f"phases[{k}]: expected 0 <= start < end <= {steps}, got {p!r}")
        spans.append((start, end, kind))
    return spans


def _trace_takeaway(ys: dict, spans: list, xs: dict | None = None) -> str:
    """The peak, said on the figure's own x axis: after how much work (the FLOP clock), or at
    which event (no clock), and in which phase."""
    names = list(ys)
    peak = {name: float(y.max()) for name, y in ys.items()}
    if len(names) == 1:
        k = int(np.argmax(ys[names[0]]))
        during = [kind for start, end, kind in spans if start <= k < end]
        phase = f", during the {during[0]}" if during else ""
        when = (f"at event {k}" if xs is None else
                f"after {_fmt('flops', float(xs[names[0]][k]))} of work")
        return f"{names[0]} peaks at {_fmt('bytes', peak[names[0]])} {when}{phase}"
    a, b = names[0], names[1]
    word = "less" if peak[a] <= peak[b] else "more"
    r = max(peak[a], peak[b]) / max(min(peak[a], peak[b]), 1.0)
    return (f"{a} peaks at {_fmt('bytes', peak[a])} vs {_fmt('bytes', peak[b])} for {b} "
            f"({_ratio(r)} {word})")
