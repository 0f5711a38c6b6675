"""The trade-off figures: one point per schedule (or method), peak memory on the y axis, and on
the x axis either the recompute FLOPs it pays (plot_pareto) or the step time it measured, with
its spread (plot_memory_vs_time): "memory vs speed", literally. Pareto-optimal points are joined
by the frontier; labels never overlap or leave the axes (figure.label_points)."""

from __future__ import annotations

from itertools import pairwise

import numpy as np

from ckptlab.measure.figure import (
    _finish,
    _fmt,
    _new_axes,
    _plain_log_labels,
    _save,
    _unit,
    label_points,
)


def pareto_front(points) -> list[int]:
    """Indices of the (x, y) points no other point beats on both (lower is better for both)."""
    pts = [(float(x), float(y)) for x, y in points]
    return [i for i, (x, y) in enumerate(pts)
            if not any(x2 <= x and y2 <= y and (x2, y2) != (x, y) for x2, y2 in pts)]


def pareto_front_with_spread(lo, hi, ys) -> list[int]:
    """Indices of the points no other point beats for sure: j beats i only when it holds no
    more memory (ys, exact) and is faster beyond the noise, its whole IQR [lo, hi] below i's
    (hi[j] < lo[i]). Overlapping IQRs cannot order two points by time, so both stay."""
    n = len(ys)
    return [i for i in range(n) if not any(
        ys[j] <= ys[i] and hi[j] < lo[i] for j in range(n) if j != i)]


def _resolved_steps(lo, hi, front) -> list[tuple[int, int]]:
    """The frontier's steps the data supports: consecutive front points (by time) whose IQRs
    do not overlap; where they overlap the order in time is unknown and no line is drawn."""
    order = sorted(front, key=lambda i: (lo[i] + hi[i]) / 2)
    return [(a, b) for a, b in pairwise(order) if hi[a] < lo[b]]


def _check(points, keys, what) -> None:
    if not points:
        raise ValueError(f"{what}: expected dicts with {', '.join(keys)}")
    for k, s in enumerate(points):
        missing = [key for key in keys if key not in s]
        if missing:
            raise ValueError(f"{what}[{k}]: missing {missing}")
        if not all(s[key] >= 0 for key in keys[1:]):
            raise ValueError(f"{what}[{k}]: expected non-negative {', '.join(keys[1:])}: {s}")


def _frontier(ax, xs, ys, front) -> None:
    order = sorted(front, key=lambda i: xs[i])
    ax.step(xs[order], ys[order], where="post", color="C0", lw=1, label="Pareto frontier")


def plot_pareto(schedules, *, title=None, path=None):
    """Peak memory against recompute FLOPs, one point per schedule (dicts with name, peak_bytes,
    recompute_flops); the Pareto-optimal ones joined by the frontier, the others grey."""
    _check(schedules, ("name", "peak_bytes", "recompute_flops"), "schedules")
    xs = np.array([s["recompute_flops"] for s in schedules], dtype=np.float64)
    ys = np.array([s["peak_bytes"] for s in schedules], dtype=np.float64)
    front = pareto_front(zip(xs, ys, strict=True))
    fscale, funit = _unit("flops", max(float(xs.max()), 1.0))
    bscale, bunit = _unit("bytes", max(float(ys.max()), 1.0))
    fig, ax = _new_axes()
    _frontier(ax, xs / fscale, ys / bscale, front)
    for i in range(len(schedules)):
        ax.plot(xs[i] / fscale, ys[i] / bscale, "o", color="C0" if i in front else "0.6", ms=7)
    ax.set_xlabel(f"recompute FLOPs per training step ({funit})")
    ax.set_ylabel(f"peak activation memory ({bunit})")
    ax.set_ylim(0, 1.12 * float(ys.max()) / bscale)
    ax.legend(fontsize=8, loc="upper right")
    if title is None:
        best = min(range(len(schedules)), key=lambda i: (ys[i], xs[i]))
        title = (f"{len(front)} of {len(schedules)} schedules are Pareto-optimal; "
                 f"{schedules[best]['name']} holds least ({_fmt('bytes', ys[best])}) for "
                 f"{_fmt('flops', xs[best])} of recompute")
    fig = _finish(fig, ax, title, None)
    label_points(ax, xs / fscale, ys / bscale, [s["name"] for s in schedules])
    return _save(fig, path)


def plot_memory_vs_time(points, *, device: str = "", log_memory: bool = False, title=None,
                        path=None):
    """Peak memory against measured time per step, one point per schedule: dicts with name,
    peak_bytes, seconds (the median) and optionally q1_s, q3_s (the interquartile range, drawn
    as a horizontal bar). Blue: the points no other beats for sure (pareto_front_with_spread);
    the frontier's line joins two of them only where their bars do not overlap, since a point
    whose bar overlaps another's cannot be ordered by time at this noise. `device` names where the
    times were measured (or modeled); log_memory puts memory on a log axis, for points that
    span decades."""
    _check(points, ("name", "peak_bytes", "seconds"), "points")
    t = np.array([p["seconds"] for p in points], dtype=np.float64)
    lo = np.array([p.get("q1_s", p["seconds"]) for p in points], dtype=np.float64)
    hi = np.array([p.get("q3_s", p["seconds"]) for p in points], dtype=np.float64)
    if np.any(lo > t) or np.any(hi < t):
        raise ValueError("points: expected q1_s <= seconds <= q3_s for every point")
    ys = np.array([p["peak_bytes"] for p in points], dtype=np.float64)
    front = pareto_front_with_spread(lo, hi, ys)
    tscale, tunit = _unit("seconds", max(float(hi.max()), 1e-9))
    bscale, bunit = _unit("bytes", max(float(ys.max()), 1.0))
    fig, ax = _new_axes()
    spread = bool(np.any(lo < t) or np.any(hi > t))
    for k, (a, b) in enumerate(_resolved_steps(lo, hi, front)):  # b: slower, holds less
        ax.step(t[[a, b]] / tscale, ys[[a, b]] / bscale, where="post", color="C0", lw=1,
                label=None if k else "Pareto frontier" + (" (IQRs apart)" if spread else ""))
    for i in range(len(points)):
        color = "C0" if i in front else "0.6"
        ax.errorbar(t[i] / tscale, ys[i] / bscale, xerr=[[(t[i] - lo[i]) / tscale],
                                                         [(hi[i] - t[i]) / tscale]],
                    fmt="o", color=color, ms=7, capsize=3, lw=1.2)
    if spread:
        ax.errorbar([], [], xerr=[], fmt="o", color="0.3", capsize=3, label="median, IQR")
    where = f" on {device}" if device else ""
    ax.set_xlabel(f"time per training step{where} ({tunit})")
    ax.set_ylabel(f"peak activation memory ({bunit})")
    ax.set_xlim(0, 1.08 * float(hi.max()) / tscale)
    if log_memory:
        ax.set_yscale("log")
        ax.set_ylim(0.5 * float(ys.min()) / bscale, 2.0 * float(ys.max()) / bscale)
        _plain_log_labels(ax.yaxis)
    else:
        ax.set_ylim(0, 1.12 * float(ys.max()) / bscale)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="lower left")  # the x axis starts at 0: that corner is empty
    if title is None:
        fast, small = int(np.argmin(t)), int(np.argmin(ys))
        title = (f"{points[small]['name']} holds least ({_fmt('bytes', ys[small])}, "
                 f"{_fmt('seconds', t[small])} a step); {points[fast]['name']} is fastest "
                 f"({_fmt('seconds', t[fast])}, {_fmt('bytes', ys[fast])})")
    fig = _finish(fig, ax, title, None)
    label_points(ax, t / tscale, ys / bscale, [p["name"] for p in points])
    return _save(fig, path)

