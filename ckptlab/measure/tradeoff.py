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
    """Indices of the points no other point beats for sure. j beats i when it holds no more
    memory (ys, exact) and is no slower beyond the noise, its whole IQR [lo, hi] at or before
    i's (hi[j] <= lo[i]), and is better in one of the two: less memory, or an IQR wholly before
    i's. Overlapping IQRs cannot order two points by time, so both stay; a point that takes
    as long as another (no spread: lo = hi) and holds more is beaten, weakly but surely."""
    n = len(ys)
    return [i for i in range(n) if not any(
        ys[j] <= ys[i] and hi[j] <= lo[i] and (ys[j] < ys[i] or hi[j] < lo[i])
        for j in range(n) if j != i)]


def fastest(lo, hi, t) -> tuple[int, list[int]]:
    """(the point with the least median time, the points whose IQRs overlap its IQR): a fastest
    point is named only when that list is empty."""
    fast = int(np.argmin(t))
    return fast, [j for j in range(len(t)) if j != fast and lo[j] <= hi[fast]]


def faster_than_baseline(points, baseline: str = "none") -> str:
    """A sentence when a point measures faster than `baseline` (no checkpointing) beyond the
    noise, its IQR wholly before the baseline's, which recompute alone cannot explain: why, from
    the allocator's peak (alloc_bytes: tracemalloc or CuPy's pool, measured) when the points
    carry it (less held, fewer and smaller fresh allocations to fault in), else that it is
    likely load; "" when no point does."""
    base = next((p for p in points if p["name"] == baseline), None)
    if base is None:
        return ""
    lo_base = base.get("q1_s", base["seconds"])
    quick = [p for p in points if p is not base and p.get("q3_s", p["seconds"]) < lo_base]
    if not quick:
        return ""
    names = ", ".join(p["name"] for p in quick)
    if all("alloc_bytes" in p for p in (base, *quick)):
        lower = [p for p in quick if p["alloc_bytes"] < base["alloc_bytes"]]
        allocs = ", ".join(f"{p['name']} {_fmt('bytes', p['alloc_bytes'])}" for p in quick)
        if len(lower) == len(quick):
            return (f"{names} measured faster than {baseline}, beyond the noise: the allocator "
                    f"peaks at {allocs} against {_fmt('bytes', base['alloc_bytes'])}: less to "
                    "allocate and fault in every step, which can outweigh the recompute on a CPU")
        return (f"{names} measured faster than {baseline}, beyond the noise, with no smaller "
                f"allocator peak ({allocs} against {_fmt('bytes', base['alloc_bytes'])}): "
                "likely load from other processes; rerun with more repeats")
    return (f"{names} measured faster than {baseline}, beyond the noise: recompute alone "
            "cannot do that; likely load, or the allocator (not measured here)")


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
    as a horizontal bar) and alloc_bytes (the allocator's peak, measured: faster_than_baseline
    reads it). The frontier's line runs through every point of the medians' Pareto front,
    solid where two neighbours' IQRs are apart and dotted where they overlap (their order is
    within the noise). Blue: on that line; hollow blue: off it but beaten by no point beyond
    the noise (pareto_front_with_spread); grey: beaten. A fastest schedule is named only when
    its IQR is apart from every other's. `device` names where the times were measured (or
    modeled); log_memory puts memory on a log axis, for points that span decades."""
    _check(points, ("name", "peak_bytes", "seconds"), "points")
    t = np.array([p["seconds"] for p in points], dtype=np.float64)
    lo = np.array([p.get("q1_s", p["seconds"]) for p in points], dtype=np.float64)
    hi = np.array([p.get("q3_s", p["seconds"]) for p in points], dtype=np.float64)
    if np.any(lo > t) or np.any(hi < t):
        raise ValueError("points: expected q1_s <= seconds <= q3_s for every point")
    ys = np.array([p["peak_bytes"] for p in points], dtype=np.float64)
    front = pareto_front_with_spread(lo, hi, ys)
    line = sorted(pareto_front(zip(t, ys, strict=True)), key=lambda i: t[i])
    tscale, tunit = _unit("seconds", max(float(hi.max()), 1e-9))
    bscale, bunit = _unit("bytes", max(float(ys.max()), 1.0))
    fig, ax = _new_axes()
    spread = bool(np.any(lo < t) or np.any(hi > t))
    named = set()
    for a, b in pairwise(line):  # b: slower, holds less
        apart = hi[a] < lo[b]
        label = ("Pareto frontier" + (" (medians; IQRs apart)" if spread else "") if apart
                 else "its order within the noise (IQRs overlap)")
        ax.step(t[[a, b]] / tscale, ys[[a, b]] / bscale, where="post", color="C0", lw=1,
                ls="-" if apart else ":", label=None if label in named else label)
        named.add(label)
    for i in range(len(points)):
        color = "C0" if i in front else "0.6"
        ax.errorbar(t[i] / tscale, ys[i] / bscale, xerr=[[(t[i] - lo[i]) / tscale],
                                                         [(hi[i] - t[i]) / tscale]],
                    fmt="o", color=color, mfc=color if i in line or i not in front else "white",
                    ms=7, capsize=3, lw=1.2)
    if spread:
        ax.errorbar([], [], xerr=[], fmt="o", color="0.3", capsize=3, label="median, IQR")
    if set(front) - set(line):
        ax.plot([], [], "o", color="C0", mfc="white", label="off the medians' frontier, within "
                "its noise")
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
        title = _time_takeaway(points, lo, hi, t, ys)
    fig = _finish(fig, ax, title, None)
    label_points(ax, t / tscale, ys / bscale, [p["name"] for p in points])
    return _save(fig, path)


def _time_takeaway(points, lo, hi, t, ys) -> str:
    small = int(np.argmin(ys))
    fast, tied = fastest(lo, hi, t)
    out = (f"{points[small]['name']} holds least ({_fmt('bytes', ys[small])}, "
           f"{_fmt('seconds', t[small])} a step); ")
    if tied:
        names = ", ".join(points[j]["name"] for j in [fast, *tied])
        out += f"no fastest beyond the noise: {names} (IQRs overlap)"
    else:
        out += f"{points[fast]['name']} is fastest ({_fmt('seconds', t[fast])}, IQRs apart)"
    note = faster_than_baseline(points)
    return out + (f"; {note}" if note else "")
