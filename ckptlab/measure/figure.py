"""What every figure shares: checked inputs, units, a canvas to measure text on, plain log
ticks, wrapped titles, and point labels placed so that none overlaps another or leaves the axes
(adjustText), with label_problems() to check a drawn figure for exactly that."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

SIZE_IN = (6.5, 4.0)
N_LABEL = "sequence length N (tokens)"


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
    "seconds": [(1e-9, "ns"), (1e-6, "µs"), (1e-3, "ms"), (1.0, "s")],
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
    FigureCanvasAgg(fig)  # a canvas to measure text with (label placement), no display
    return fig, fig.subplots()


def plain_log_ticks(axis) -> None:
    """Label a log axis (ax.xaxis or ax.yaxis) with plain numbers at 1, 2, 5 per decade: 20 and
    0.5, never 2x10^1."""
    _plain_log_labels(axis)


def _plain_log_labels(axis) -> None:
    """Ticks on a log axis at 1, 2, 5 per decade, labelled as plain numbers (20, 0.5) rather
    than 2x10^1, so even an axis spanning less than a decade has labels to read."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _n_ticks(ax, n) -> None:
    """The x axis of a sweep: one labelled tick per N that was run. The y axis: plain labels at
    1, 2, 5 per decade, its limits on the labelled values just beyond the data, so the ticks
    cover every point (data from 23 to 398 reads against 20 ... 500, not 50 ... 200)."""
    ax.set_xlabel(N_LABEL)
    ax.set_xticks(n)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    _plain_log_labels(ax.yaxis)
    ys = np.concatenate([np.asarray(line.get_ydata(), dtype=np.float64) for line in ax.lines])
    ys = ys[np.isfinite(ys) & (ys > 0)]
    if ys.size:
        ax.set_ylim(nice_below(ys.min() / 1.05), nice_above(ys.max() * 1.05))


def _nice(x: float) -> np.ndarray:
    """The 1-2-5 values around positive x: 20, 50, 100 ... bracketing it."""
    decade = 10.0 ** math.floor(math.log10(x))
    return np.array([s * decade * f for f in (0.1, 1.0, 10.0) for s in (1.0, 2.0, 5.0)])


def nice_below(x: float) -> float:
    """The largest of 1, 2, 5 x 10^k not above x (398 -> 200, 23 -> 20)."""
    v = _nice(x)
    return float(v[v <= x * (1 + 1e-12)].max())


def nice_above(x: float) -> float:
    """The smallest of 1, 2, 5 x 10^k not below x (398 -> 500, 23 -> 50)."""
    v = _nice(x)
    return float(v[v >= x * (1 - 1e-12)].min())


def wrap_title(title: str, width: int = 72) -> str:
    """Wrap a title into as few lines as fit `width`, of balanced lengths (no line left with
    one orphaned word)."""
    lines = textwrap.wrap(" ".join(title.split()), width)
    if len(lines) <= 1:
        return "\n".join(lines)
    even = math.ceil(len(" ".join(lines)) / len(lines))
    for w in range(even, width + 1):  # the narrowest width that needs no more lines
        balanced = textwrap.wrap(" ".join(lines), w)
        if len(balanced) == len(lines):
            return "\n".join(balanced)
    return "\n".join(lines)


def _save(fig, path) -> Figure:
    """Save as PNG (after any labels are placed: _finish lays the figure out first)."""
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fig.savefig(path, format="png", dpi=150)
        except OSError as e:  # a full disk: name the file (the writer does not)
            e.filename = e.filename or str(path)
            raise
    return fig


def _finish(fig, ax, title: str, path) -> Figure:
    ax.set_title(wrap_title(title), fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


# ------------------------------------------------------------------------------ point labels


def label_points(ax, xs, ys, names, *, fontsize: int = 8) -> list:
    """Write names[i] next to the point (xs[i], ys[i]) (in data coordinates), moved by
    adjustText until no two labels overlap and none leaves the axes; a thin line joins a label
    that moved away to its point. Returns the Text objects."""
    from adjustText import adjust_text

    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    texts = [ax.text(x, y, str(n), fontsize=fontsize) for x, y, n in zip(xs, ys, names,
                                                                        strict=True)]
    ax.figure.canvas.draw()  # final limits and a renderer, before measuring text
    lines: list = []
    for k, expand in enumerate(((1.1, 1.3), (1.2, 1.5), (1.3, 1.8))):  # wider until clean
        if k and not label_problems(ax.figure):  # the first pass moves labels off the points
            break
        for line in lines:  # each pass draws its own lines, from where it leaves the labels
            line.remove()
        legend = ax.get_legend()
        # target_x/y: each line ends at its point (by default adjustText joins a label to
        # where the text stood before this pass)
        _, lines = adjust_text(texts, ax=ax, x=xs, y=ys, target_x=xs, target_y=ys,
                               objects=[legend] if legend is not None else None,
                               ensure_inside_axes=True, expand=expand, force_text=(0.3, 0.5),
                               iter_lim=2000,
                               arrowprops=dict(arrowstyle="-", color="0.55", lw=0.6))
    return texts


def label_problems(fig) -> list[str]:
    """Every pair of text labels inside an axes whose boxes overlap, and every label whose box
    leaves its axes, as readable lines ([] when there are none). Titles, axis labels, tick
    labels are not ax.texts, so they are not checked; a label on the legend is a problem."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    problems = []
    for ax in fig.axes:
        frame = ax.get_window_extent(renderer)
        boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in ax.texts
                 if t.get_visible() and t.get_text()]
        legend = ax.get_legend()
        if legend is not None:
            problems += [f"{name!r} overlaps the legend" for name, box in boxes
                         if box.overlaps(legend.get_window_extent(renderer))]
        for k, (name, box) in enumerate(boxes):
            if (box.x0 < frame.x0 - 0.5 or box.x1 > frame.x1 + 0.5 or box.y0 < frame.y0 - 0.5
                    or box.y1 > frame.y1 + 0.5):
                problems.append(f"{name!r} leaves the axes")
            problems += [f"{name!r} overlaps {other!r}" for other, b2 in boxes[k + 1:]
                         if box.overlaps(b2)]
    return problems
