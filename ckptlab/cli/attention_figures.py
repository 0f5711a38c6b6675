"""The figures of `python -m ckptlab bench attention --png DIR` (and of the tour and lab 05):
memory against speed where the bargain holds, modeled at a size that fills the waves, beside
the model's check at the sizes that ran; and each method's HBM bytes against N.

    rows = bench_attention.sweep([256, 1024])
    attention_figures.figures(rows, "out/")        # the two PNGs of FIGURES
"""

from __future__ import annotations

from pathlib import Path

from ckptlab.measure import memory_speed, timemodel

IMPLS = timemodel.CHAIN  # naive, stored, flash


def bytes_by_source(rows: list[dict]) -> dict:
    """{method: {source: bytes per N}} for plots.plot_bytes_vs_n (None where a source is
    absent)."""
    out: dict = {}
    for r in rows:
        by = out.setdefault(r["impl"], {})
        by.setdefault(r["bytes_source"], []).append(r["counted_bytes"])
        by.setdefault("unique", []).append(r["unique_bytes"])
        if "measured_bytes" in r:
            by.setdefault("measured", []).append(r["measured_bytes"])
    return out


FIGURES = ("attention_memory_vs_speed.png", "attention_bytes_vs_n.png")  # what --png DIR holds


def at_scale(rows: list[dict]) -> tuple[int, int, int, bool]:
    """(B, H, N, own) of the memory-against-speed figure: the run's own size (own = True) when
    its largest N fills every launch's waves and exceeds the L2 on every modeled GPU, else the
    size memory_speed.at_scale_size picks (B = 1, H = 16, N >= 4096), modeled."""
    r0 = rows[0]
    gpus = r0["modeled_gpus"].split(",")
    impls = sorted({r["impl"] for r in rows})
    big = max(r["N"] for r in rows)
    try:
        mine = memory_speed.at_scale_size(gpus, r0["d"], r0["B"], r0["H"], n_min=big,
                                          methods=impls)
    except ValueError:  # no N fills the waves at this B, H
        mine = None
    if mine == big:
        return r0["B"], r0["H"], big, True
    B, H = memory_speed.AT_SCALE["B"], memory_speed.AT_SCALE["H"]
    return B, H, memory_speed.at_scale_size(gpus, r0["d"], B, H, methods=impls), False


def plot_memory_vs_speed(rows: list[dict], path=None):
    """Memory against speed where the bargain holds, beside the model's check (module
    docstring, --png); returns the Figure."""
    from ckptlab.measure import tradeoff_plots

    r0 = rows[0]
    gpus = r0["modeled_gpus"].split(",")
    impls = [m for m in IMPLS if any(r["impl"] == m for r in rows)]
    B, H, N, own = at_scale(rows)
    points = memory_speed.at_scale_points(B, H, N, r0["d"], gpus, methods=impls,
                                          causal=r0["causal"], deterministic=r0["deterministic"])
    if own and "time_s" in r0:  # the run measured this very size: its times beside the model's
        for p in points:
            r = next(r for r in rows if r["N"] == N and r["impl"] == p["method"])
            p["times"]["measured"] = (r["time_p10_s"], r["time_s"], r["time_p90_s"])
    size = (f"N={N}, B={B} H={H} d={r0['d']}" + (", causal" if r0["causal"] else "")
            + (", deterministic dQ" if r0["deterministic"] else ""))
    return tradeoff_plots.plot_memory_vs_speed_at_scale(
        points, memory_speed.check_points(rows), size=size, path=path)


def figures(rows: list[dict], folder) -> list[Path]:
    """FIGURES into `folder`: memory against speed (plot_memory_vs_speed), bytes against N."""
    from ckptlab.measure import plots

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in FIGURES]
    plot_memory_vs_speed(rows, paths[0])
    plots.plot_bytes_vs_n(sorted({r["N"] for r in rows}), bytes_by_source(rows), path=paths[1])
    return paths
