"""The figures the labs and the command line draw. Each function takes plain data (lists, dicts,
arrays), returns a matplotlib Figure sized for a notebook (6.5 in wide) and, given `path`, saves
it as PNG. Figures are built with matplotlib.figure.Figure, never pyplot, so no display and no
global state are involved (safe on a headless machine, under the Agg backend).

Titles state the takeaway. Pass `title=` to say it yourself; otherwise it is derived from the
data ("flash saves 64x peak memory vs naive at N=4096"). Axes carry units; byte axes use binary
units (KiB, MiB, GiB), FLOP axes decimal ones (GFLOP, TFLOP/s).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

from ckptlab.measure import roofline
from ckptlab.measure.ncu import SOURCES

SIZE_IN = (6.5, 4.0)
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
N_LABEL = "sequence length N (tokens)"


def fit_loglog_slope(x, y) -> float:
    """Least-squares slope of log y against log x: y ~ c * x^slope (2 for "grows as N^2")."""
    x, y = _positive("x", x), _positive("y", y)
    if len(x) != len(y) or len(x) < 2:
        raise ValueError(f"x, y: expected equal lengths >= 2, got {len(x)} and {len(y)}")
    if np.ptp(np.log(x)) == 0:
        raise ValueError("x: expected at least two distinct values to fit a slope")
    slope, _ = np.polyfit(np.log(x), np.log(y), 1)
    return float(slope)


# ------------------------------------------------------------------------------ helpers


def _positive(name: str, values) -> np.ndarray:
    """A 1-D float64 array of finite positive numbers (what a log axis can show)."""
    a = np.asarray(values, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{name}: expected a non-empty 1-D sequence, got shape {a.shape}")
    if not np.all(np.isfinite(a) & (a > 0)):
        raise ValueError(f"{name}: expected finite positive numbers, got {a.tolist()}")
    return a


def _series(name: str, values, n: int, *, allow_missing: bool = False) -> np.ndarray:
    """One y-series of length n; None/NaN marks a missing point when allow_missing."""
    a = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    if a.shape != (n,):
        raise ValueError(f"{name}: expected {n} values (one per N), got {a.shape[0]}")
    ok = np.isnan(a) if allow_missing else np.zeros(n, dtype=bool)
    if not np.all(ok | (np.isfinite(a) & (a > 0))):
        raise ValueError(f"{name}: expected finite positive numbers, got {a.tolist()}")
    return a


_UNITS = {
    "bytes": [(1024.0**k, u) for k, u in enumerate(["B", "KiB", "MiB", "GiB", "TiB"])],
    "seconds": [(1e-9, "ns"), (1e-6, "us"), (1e-3, "ms"), (1.0, "s")],
    "flops": [(1.0, "FLOP"), (1e3, "KFLOP"), (1e6, "MFLOP"), (1e9, "GFLOP"), (1e12, "TFLOP"),
              (1e15, "PFLOP")],
}


def _unit(kind: str, largest: float) -> tuple[float, str]:
    """The largest unit of `kind` that keeps `largest` >= 1 (e.g. 3e6 bytes -> MiB)."""
    scale, name = _UNITS[kind][0]
    for s, u in _UNITS[kind]:
        if largest >= s:
            scale, name = s, u
    return scale, name


def _fmt(kind: str, value: float) -> str:
    scale, unit = _unit(kind, value)
    return f"{value / scale:.3g} {unit}"


def _ratio(r: float) -> str:
    return f"{r:.0f}x" if r >= 10 else f"{r:.1f}x"


def _new_axes():
    fig = Figure(figsize=SIZE_IN)
    return fig, fig.subplots()


def _plain_log_labels(axis) -> None:
    """Ticks on a log axis at 1, 2, 5 per decade, labelled as plain numbers (20, 0.5) rather
    than 2x10^1, so even an axis spanning less than a decade has labels to read."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _n_ticks(ax, n) -> None:
    """The x axis of a sweep: one labelled tick per N that was run."""
    ax.set_xlabel(N_LABEL)
    ax.set_xticks(n)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    _plain_log_labels(ax.yaxis)


def _finish(fig, ax, title: str, path) -> Figure:
    ax.set_title(textwrap.fill(title, 72), fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png", dpi=150)
    return fig


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
    for name, x, y, measured in pts:
        ax.plot([max(x, 1e-3)], [y / scale], "o", ms=7, mfc="C1" if measured else "none",
                mec="C1")
        ax.annotate(name, (max(x, 1e-3), y / scale), textcoords="offset points", xytext=(5, 4),
                    fontsize=8)
    ax.plot([], [], "o", mfc="C1", mec="C1", label="achieved (measured time)")
    ax.plot([], [], "o", mfc="none", mec="C1", label="on the roof (modeled)")
    _plain_log_labels(ax.xaxis)
    _plain_log_labels(ax.yaxis)
    ax.set_xlabel("arithmetic intensity (FLOP/byte of HBM traffic)")
    ax.set_ylabel(f"performance ({unit}/s)")
    ax.legend(fontsize=8, loc="lower right")
    if title is None:
        below = [p[0] for p in pts if p[1] < ridge]
        who = f"all {len(pts)}" if len(below) == len(pts) else f"{len(below)} of {len(pts)}"
        title = (f"{who} kernels are memory-bound on {spec['name']} ({dtype} ridge "
                 f"{ridge:.3g} FLOP/byte)")
    return _finish(fig, ax, title, path)


def plot_memory_trace(traces: dict, phases, *, title=None, path=None):
    """Memory held after each step of a training step (forward, recompute, backward), one line
    per schedule in `traces` (name -> bytes per step). `phases` shades the first schedule's
    steps: (start, end, kind) spans steps start..end-1, kind forward/recompute/backward."""
    if not isinstance(traces, dict) or not traces:
        raise ValueError(f"traces: expected a non-empty dict name -> bytes per step: {traces!r}")
    ys = {}
    for name, values in traces.items():
        y = np.asarray(values, dtype=np.float64)
        if y.ndim != 1 or y.size == 0 or not np.all(np.isfinite(y) & (y >= 0)):
            raise ValueError(f"traces[{name!r}]: expected non-negative bytes per step: {values}")
        ys[name] = y
    first = next(iter(ys))
    spans = _check_phases(phases, len(ys[first]))
    scale, unit = _unit("bytes", max(float(y.max()) for y in ys.values()))
    fig, ax = _new_axes()
    for start, end, kind in spans:
        ax.axvspan(start - 0.5, end - 0.5, color=PHASE_COLOR[kind], alpha=0.15, lw=0)
    for name, y in ys.items():
        ax.step(np.arange(len(y)), y / scale, where="mid", label=name)  # x: step index
    handles, _ = ax.get_legend_handles_labels()
    kinds = [k for k in PHASE_COLOR if any(s[2] == k for s in spans)]
    handles += [Patch(color=PHASE_COLOR[k], alpha=0.3, label=f"{k} ({first})") for k in kinds]
    ax.legend(handles=handles, fontsize=8)
    ax.set_xlabel("step (ops in execution order)")
    ax.set_ylabel(f"memory held ({unit})")
    ax.set_ylim(bottom=0)
    if title is None:
        title = _trace_takeaway(ys, spans)
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


def _trace_takeaway(ys: dict, spans: list) -> str:
    names = list(ys)
    peak = {name: float(y.max()) for name, y in ys.items()}
    if len(names) == 1:
        k = int(np.argmax(ys[names[0]]))
        during = [kind for start, end, kind in spans if start <= k < end]
        phase = f", during {during[0]}" if during else ""
        return f"{names[0]} peaks at {_fmt('bytes', peak[names[0]])} at step {k}{phase}"
    a, b = names[0], names[1]
    word = "less" if peak[a] <= peak[b] else "more"
    r = max(peak[a], peak[b]) / max(min(peak[a], peak[b]), 1.0)
    return (f"{a} peaks at {_fmt('bytes', peak[a])} vs {_fmt('bytes', peak[b])} for {b} "
            f"({_ratio(r)} {word})")


def pareto_front(points) -> list[int]:
    """Indices of the (x, y) points no other point beats on both (lower is better for both)."""
    pts = [(float(x), float(y)) for x, y in points]
    return [i for i, (x, y) in enumerate(pts)
            if not any(x2 <= x and y2 <= y and (x2, y2) != (x, y) for x2, y2 in pts)]


def plot_pareto(schedules, *, title=None, path=None):
    """Peak memory against recompute FLOPs, one point per schedule (dicts with name, peak_bytes,
    recompute_flops); the Pareto-optimal ones joined by the frontier, the others grey."""
    if not schedules:
        raise ValueError("schedules: expected dicts with name, peak_bytes, recompute_flops")
    for k, s in enumerate(schedules):
        missing = [key for key in ("name", "peak_bytes", "recompute_flops") if key not in s]
        if missing:
            raise ValueError(f"schedules[{k}]: missing {missing}")
        if not (s["peak_bytes"] >= 0 and s["recompute_flops"] >= 0):
            raise ValueError(f"schedules[{k}]: expected non-negative peak_bytes and FLOPs: {s}")
    xs = np.array([s["recompute_flops"] for s in schedules], dtype=np.float64)
    ys = np.array([s["peak_bytes"] for s in schedules], dtype=np.float64)
    front = pareto_front(zip(xs, ys, strict=True))
    fscale, funit = _unit("flops", max(float(xs.max()), 1.0))
    bscale, bunit = _unit("bytes", max(float(ys.max()), 1.0))
    fig, ax = _new_axes()
    order = sorted(front, key=lambda i: xs[i])
    ax.step(xs[order] / fscale, ys[order] / bscale, where="post", color="C0", lw=1,
            label="Pareto frontier")
    for i, s in enumerate(schedules):
        on = i in front
        ax.plot(xs[i] / fscale, ys[i] / bscale, "o", color="C0" if on else "0.6", ms=7)
        ax.annotate(s["name"], (xs[i] / fscale, ys[i] / bscale), textcoords="offset points",
                    xytext=(5, 4), fontsize=8)
    ax.set_xlabel(f"recompute FLOPs per training step ({funit})")
    ax.set_ylabel(f"peak activation memory ({bunit})")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    if title is None:
        best = min(range(len(schedules)), key=lambda i: (ys[i], xs[i]))
        title = (f"{len(front)} of {len(schedules)} schedules are Pareto-optimal; "
                 f"{schedules[best]['name']} holds least ({_fmt('bytes', ys[best])}) for "
                 f"{_fmt('flops', xs[best])} of recompute")
    return _finish(fig, ax, title, path)
