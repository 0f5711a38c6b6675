"""Memory against speed, literally: what a method keeps for its backward against how long it
takes, beside the same memory against the FLOPs it runs.

    plot_memory_vs_speed(points, memory_label=..., path=...)

Each point is a method (or a schedule): its name, the memory it holds, its FLOPs, and one or
more times by where they come from ({"A100 (modeled)": (lower, upper), "measured": (p10, median,
p90)}). A modeled time is drawn as a bar from its lower to its upper bound, a measured one as its
median with the spread; a marker shape per source, a colour per point. Lower-left is better on
both panels; the names never overlap (figure.label_points). Built with matplotlib.figure.Figure
(no pyplot, no display needed).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from ckptlab.measure.figure import label_points

MARKERS = "osD^v<>"
_UNITS = {
    "bytes": [(1.0, "B"), (1024.0, "KiB"), (1024.0**2, "MiB"), (1024.0**3, "GiB")],
    "seconds": [(1e-9, "ns"), (1e-6, "µs"), (1e-3, "ms"), (1.0, "s")],
    "flops": [(1.0, "FLOP"), (1e6, "MFLOP"), (1e9, "GFLOP"), (1e12, "TFLOP")],
}


def unit(kind: str, largest: float) -> tuple[float, str]:
    """The largest unit of `kind` that keeps `largest` >= 1 (3e6 bytes -> MiB)."""
    scale, name = _UNITS[kind][0]
    for s, u in _UNITS[kind]:
        if largest >= s:
            scale, name = s, u
    return scale, name


def _plain_log(axis) -> None:
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def time_label(tunit: str, spans) -> str:
    """The time axis says what its bars are: modeled bounds, measured spreads, or both."""
    modeled = any(len(t) == 2 for t in spans)
    measured = any(len(t) == 3 for t in spans)
    if modeled and measured:
        return f"time ({tunit}); bars: modeled lower-upper, measured p10-p90"
    if measured:
        return f"time ({tunit}), measured; bars: p10-p90 about the median"
    return f"time ({tunit}), modeled; bars: lower-upper bound"


def _check(points) -> list[str]:
    if not points:
        raise ValueError("points: expected dicts with name, memory_bytes, flops, times")
    sources: list[str] = []
    for k, p in enumerate(points):
        missing = [key for key in ("name", "memory_bytes", "flops", "times") if key not in p]
        if missing:
            raise ValueError(f"points[{k}]: missing {missing}; expected name, memory_bytes, "
                             "flops, times")
        if not (p["memory_bytes"] > 0 and p["flops"] > 0):
            raise ValueError(f"points[{k}]: memory_bytes and flops must be positive: {p}")
        for src, t in p["times"].items():
            if len(t) not in (2, 3) or not all(x > 0 for x in t) or list(t) != sorted(t):
                raise ValueError(f"points[{k}].times[{src!r}]: expected (lower, upper) or "
                                 f"(p10, median, p90), positive and ordered, got {t}")
            if src not in sources:
                sources.append(src)
    return sources


def _time_panel(ax, points, sources, mem, mscale, tscale) -> None:
    """Memory against time: each source of time a marker shape, modeled bounds and measured
    spreads as bars, a colour per point."""
    for i, p in enumerate(points):
        for j, src in enumerate(sources):
            if src not in p["times"]:
                continue
            t = np.array(p["times"][src], dtype=np.float64) / tscale
            mid = t[1] if len(t) == 3 else np.sqrt(t[0] * t[-1])  # bar centre on a log axis
            ax.errorbar([mid], [mem[i] / mscale], xerr=[[mid - t[0]], [t[-1] - mid]],
                        fmt=MARKERS[j % len(MARKERS)], color=f"C{i}", ms=7, capsize=3)
    for j, src in enumerate(sources):
        ax.plot([], [], MARKERS[j % len(MARKERS)], color="0.3", label=src)


def _log_axes(ax, memory_label, munit) -> None:
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log(ax.xaxis)
    _plain_log(ax.yaxis)
    ax.set_ylabel(f"{memory_label} ({munit})")
    ax.grid(True, which="major", alpha=0.3)
    ax.margins(0.25)


def _label(ax, xs, ys, names) -> None:
    ax.figure.tight_layout()  # the final axes sizes, before the labels are placed
    for k, text in enumerate(label_points(ax, xs, ys, names)):
        text.set_color(f"C{k}")


def _save_png(fig, path):
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fig.savefig(path, format="png", dpi=150)
        except OSError as e:  # a full disk: name the file (the writer does not)
            e.filename = e.filename or str(path)
            raise
    return fig


def plot_memory_vs_speed(points, *, memory_label="saved for the backward", title=None,
                         path=None) -> Figure:
    """Two panels: memory against time (each source of time a marker shape; modeled bounds and
    measured spreads as bars) and memory against FLOPs. Returns the Figure; saves a PNG to
    `path` when given."""
    sources = _check(points)
    mem = np.array([p["memory_bytes"] for p in points], dtype=np.float64)
    flops = np.array([p["flops"] for p in points], dtype=np.float64)
    spans = [t for p in points for t in p["times"].values()]
    mscale, munit = unit("bytes", mem.max())
    tscale, tunit = unit("seconds", max(max(t) for t in spans))
    fscale, funit = unit("flops", flops.max())
    fig = Figure(figsize=(10.0, 4.2))
    FigureCanvasAgg(fig)  # a renderer, so the labels can be measured and moved
    ax_t, ax_f = fig.subplots(1, 2)
    _time_panel(ax_t, points, sources, mem, mscale, tscale)
    for i in range(len(points)):
        ax_f.plot([flops[i] / fscale], [mem[i] / mscale], "o", color=f"C{i}", ms=7)
    for ax in (ax_t, ax_f):
        _log_axes(ax, memory_label, munit)
    ax_t.set_xlabel(time_label(tunit, spans))
    ax_t.legend(fontsize=8, loc="best")
    ax_f.set_xlabel(f"hardware FLOPs ({funit}), recompute included")
    names = [p["name"] for p in points]
    left = [min(t[0] for t in p["times"].values()) / tscale for p in points]  # bars' left ends
    _label(ax_t, left, mem / mscale, names)
    _label(ax_f, flops / fscale, mem / mscale, names)
    ax_t.set_title("memory against speed", fontsize=10)
    ax_f.set_title("memory against FLOPs", fontsize=10)
    if title is None:
        least = int(np.argmin(mem))
        scale, name = unit("bytes", mem[least])
        title = (f"{points[least]['name']} holds least ({mem[least] / scale:.3g} {name}); "
                 "lower-left is better on both panels")
    fig.suptitle(textwrap.fill(title, 110), fontsize=11)
    fig.tight_layout()
    return _save_png(fig, path)


CHECK_MARKERS = {"counted bytes": "o", "unique bytes": "v", "saved bytes": "s", "time": "D"}


def plot_memory_vs_speed_at_scale(points, check, *, size: str, memory_label="saved for the "
                                  "backward", title=None, path=None) -> Figure:
    """Memory against modeled speed at a size where the model means something (`points`, as
    plot_memory_vs_speed takes them; `size` says which, "N=4096, B=1 H=16 d=64"), beside the
    model's check at the sizes that ran (`check`: dicts with method, N, quantity, got and
    modeled = (lower, upper), memory_speed.check_points): each count or measurement against its
    model, every point on the diagonal when they agree. Returns the Figure; saves a PNG to
    `path` when given."""
    sources = _check(points)
    if not check:
        raise ValueError("check: expected the points of the sizes that ran "
                         "(memory_speed.check_points), got none")
    mem = np.array([p["memory_bytes"] for p in points], dtype=np.float64)
    spans = [t for p in points for t in p["times"].values()]
    mscale, munit = unit("bytes", mem.max())
    tscale, tunit = unit("seconds", max(max(t) for t in spans))
    fig = Figure(figsize=(10.0, 4.4))
    FigureCanvasAgg(fig)
    ax_t, ax_c = fig.subplots(1, 2)
    _time_panel(ax_t, points, sources, mem, mscale, tscale)
    _log_axes(ax_t, memory_label, munit)
    ax_t.set_xlabel(time_label(tunit, spans))
    ax_t.legend(fontsize=8, loc="best")
    ax_t.set_title(f"memory against speed at {size}", fontsize=10)
    worst = _check_panel(ax_c, check, [p.get("method", p["name"]) for p in points])
    left = [min(t[0] for t in p["times"].values()) / tscale for p in points]
    _label(ax_t, left, mem / mscale, [p["name"] for p in points])
    if title is None:
        title = at_scale_takeaway(points, size)
    fig.suptitle(textwrap.fill(title + f"; the model's check: {worst}", 110), fontsize=11)
    fig.tight_layout()
    return _save_png(fig, path)


def _check_panel(ax, check, methods) -> str:
    """Each checked quantity against its model, log-log, with the diagonal; returns how far the
    farthest point lies from its model, in words."""
    colors = {m: f"C{k}" for k, m in enumerate(methods)}
    got = np.array([c["got"] for c in check], dtype=np.float64)
    lo = np.array([c["modeled"][0] for c in check], dtype=np.float64)
    hi = np.array([c["modeled"][1] for c in check], dtype=np.float64)
    if not (np.all(got > 0) and np.all(lo > 0) and np.all(hi >= lo)):
        raise ValueError("check: expected positive values and modeled = (lower, upper)")
    for c, g, a, b in zip(check, got, lo, hi, strict=True):
        mid = np.sqrt(a * b)
        ax.errorbar([mid], [g], xerr=[[mid - a], [b - mid]], fmt=CHECK_MARKERS[c["quantity"]],
                    color=colors.get(c["method"], "0.3"), ms=6, capsize=2, alpha=0.85)
    edge = [min(got.min(), lo.min()) / 1.5, max(got.max(), hi.max()) * 1.5]
    ax.plot(edge, edge, color="0.5", lw=0.8, ls="--", label="= its model")
    for q in dict.fromkeys(c["quantity"] for c in check):
        ax.plot([], [], CHECK_MARKERS[q], color="0.3", label=q)
    for m in dict.fromkeys(c["method"] for c in check):
        ax.plot([], [], "s", color=colors.get(m, "0.3"), ms=5, label=m)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("modeled (traffic models; times: lower-upper)")
    where = sorted({c["source"] for c in check})
    ax.set_ylabel(" and ".join(where).replace("emulator", "counted by the emulator")
                  .replace("measured", "measured on this GPU"))
    ns = sorted({c["N"] for c in check})
    ax.set_title(f"the model's check at N = {', '.join(map(str, ns))}", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="major", alpha=0.3)
    off = np.where(got < lo, lo / got - 1, np.where(got > hi, got / hi - 1, 0.0))
    return ("every count equals its model" if off.max() == 0 and "time" not in
            {c["quantity"] for c in check} else f"at most {off.max():.1%} outside the model")


def at_scale_takeaway(points, size: str) -> str:
    """What the figure shows, in numbers: the method that holds least against the one that
    holds most, in memory and in time (the first source's lower bounds)."""
    mem = [p["memory_bytes"] for p in points]
    src = next(iter(points[0]["times"]))
    t = [p["times"][src][0] for p in points]
    least, most = int(np.argmin(mem)), int(np.argmax(mem))
    ratio = t[least] / t[most]
    speed = (f"{1 / ratio:.2g}x faster" if ratio < 1 else f"{ratio:.2g}x slower"
             if ratio > 1 else "as fast")
    where = src.replace(" (modeled)", "") + (", modeled" if "modeled" in src else "")
    return (f"at {size}: {points[least]['name']} holds {mem[most] / mem[least]:.3g}x less "
            f"than {points[most]['name']} and is {speed} ({where}, lower bound)")
