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
    for i, p in enumerate(points):
        color = f"C{i}"
        for j, src in enumerate(sources):
            if src not in p["times"]:
                continue
            t = np.array(p["times"][src], dtype=np.float64) / tscale
            mid = t[1] if len(t) == 3 else np.sqrt(t[0] * t[-1])  # bar centre on a log axis
            ax_t.errorbar([mid], [mem[i] / mscale], xerr=[[mid - t[0]], [t[-1] - mid]],
                          fmt=MARKERS[j % len(MARKERS)], color=color, ms=7, capsize=3)
        ax_f.plot([flops[i] / fscale], [mem[i] / mscale], "o", color=color, ms=7)
    for j, src in enumerate(sources):
        ax_t.plot([], [], MARKERS[j % len(MARKERS)], color="0.3", label=src)
    for ax in (ax_t, ax_f):
        ax.set_xscale("log")
        ax.set_yscale("log")
        _plain_log(ax.xaxis)
        _plain_log(ax.yaxis)
        ax.set_ylabel(f"{memory_label} ({munit})")
        ax.grid(True, which="major", alpha=0.3)
        ax.margins(0.25)
    ax_t.set_xlabel(time_label(tunit, [t for p in points for t in p["times"].values()]))
    ax_t.legend(fontsize=8, loc="best")
    ax_f.set_xlabel(f"hardware FLOPs ({funit}), recompute included")
    names = [p["name"] for p in points]
    left = [min(t[0] for t in p["times"].values()) / tscale for p in points]  # bars' left ends
    for ax, xs in ((ax_t, left), (ax_f, flops / fscale)):
        ax.figure.tight_layout()  # the final axes sizes, before the labels are placed
        texts = label_points(ax, xs, mem / mscale, names)
        for k, text in enumerate(texts):
            text.set_color(f"C{k}")
    ax_t.set_title("memory against speed", fontsize=10)
    ax_f.set_title("memory against FLOPs", fontsize=10)
    if title is None:
        least = int(np.argmin(mem))
        scale, name = unit("bytes", mem[least])
        title = (f"{points[least]['name']} holds least ({mem[least] / scale:.3g} {name}); "
                 "lower-left is better on both panels")
    fig.suptitle(textwrap.fill(title, 110), fontsize=11)
    fig.tight_layout()
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fig.savefig(path, format="png", dpi=150)
        except OSError as e:  # a full disk: name the file (the writer does not)
            e.filename = e.filename or str(path)
            raise
    return fig
