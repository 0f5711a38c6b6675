"""The rows of `python -m ckptlab bench checkpoint` (bench_checkpoint.run), read: the table
(predicted and measured peaks, each step time with its interquartile range, FLOPs) and its
notes (why a PyTorch column is empty, which rows' time ranges overlap so that their order is not
resolved, a checkpointed step that measures faster than none), and the two figures of --png.

    rows = bench_checkpoint.run("mlp", layers=8, schedule_specs=["none", "sqrt"])
    print(checkpoint_report.table(rows))
    checkpoint_report.figures(rows, "out/")      # memory against step time, the Pareto front
"""

from __future__ import annotations

from pathlib import Path

from ckptlab.measure import plots, tradeoff


def time_points(rows: list[dict]) -> list[dict]:
    """The schedules' rows as plots.plot_memory_vs_time's points: the ledger's peak, the step's
    median and IQR, and the allocator's peak (which says why a checkpointed step can measure
    faster than none: tradeoff.faster_than_baseline)."""
    return [dict(name=r["schedule"], peak_bytes=r["measured_peak_bytes"], seconds=r["step_s"],
                 q1_s=r["step_q1_s"], q3_s=r["step_q3_s"], alloc_bytes=r["allocator_peak_bytes"])
            for r in rows if "measured_peak_bytes" in r]


def overlapping(rows: list[dict], key: str = "step") -> list[tuple[str, str]]:
    """Pairs of schedules whose interquartile ranges of `key` time overlap: at this noise
    their order by time is not resolved."""
    timed = [r for r in rows if f"{key}_q1_s" in r and "predicted_peak_bytes" in r]
    return [(a["schedule"], b["schedule"]) for k, a in enumerate(timed) for b in timed[k + 1:]
            if a[f"{key}_q1_s"] <= b[f"{key}_q3_s"] and b[f"{key}_q1_s"] <= a[f"{key}_q3_s"]]


def overlap_warning(rows: list[dict]) -> str:
    """One line naming the overlapping pairs, or "" when every pair's ranges are apart."""
    pairs = overlapping(rows)
    if not pairs:
        return ""
    return (f"warning: {len(pairs)} pair(s) of rows have overlapping time ranges (IQR), so their "
            "order is not resolved at this noise: " + ", ".join(f"{a} ~ {b}" for a, b in pairs)
            + f"; rerun with more --repeats (now {rows[0].get('repeats', '?')}) on a quieter "
            "machine")


def _fmt_bytes(n) -> str:
    return f"{'-':>12}" if n is None else f"{n / 2**20:8.3f} MiB"


def fmt_spread(r: dict, key: str = "step") -> str:
    """'8.50 [8.10-9.00] ms': the median and the interquartile range, in one unit."""
    if f"{key}_s" not in r:
        return "-"
    med, q1, q3 = r[f"{key}_s"], r.get(f"{key}_q1_s", r[f"{key}_s"]), r.get(f"{key}_q3_s",
                                                                         r[f"{key}_s"])
    scale, unit = (1.0, "s") if med >= 1 else (1e-3, "ms") if med >= 1e-3 else (1e-6, "µs")
    digits = 0 if med / scale >= 100 else 1 if med / scale >= 10 else 2  # 3 significant
    return f"{med / scale:.{digits}f} [{q1 / scale:.{digits}f}-{q3 / scale:.{digits}f}] {unit}"


def table(rows) -> str:
    """The rows as text: memory, time with its spread, FLOPs; then notes: why a PyTorch column
    is empty, and a warning when time ranges overlap too much to order the rows."""
    with_torch = any("torch_step_s" in r for r in rows)
    head = (f"{'schedule':<24} {'predicted':>12} {'measured':>12} {'err':>6} {'allocator':>12} "
            f"{'step: median [IQR]':>24} {'/hand':>6} {'HW/model':>8} {'GFLOP/s':>8}")
    if with_torch:
        head += f" {'torch step [IQR]':>24} {'torch saved':>12}"
    r0 = rows[0]
    lines = [f"{r0['model']} L={r0['layers']} width={r0['width']} batch={r0['batch']} "
             f"{r0['dtype']} on {r0['device']}, {r0.get('repeats', '?')} repeats", head]
    for r in rows:
        if "predicted_peak_bytes" not in r:
            lines.append(f"{r['schedule']:<24} {'':>45} {fmt_spread(r):>24} {1.0:6.2f}")
            continue
        line = (f"{r['schedule']:<24} {_fmt_bytes(r['predicted_peak_bytes'])} "
                f"{_fmt_bytes(r['measured_peak_bytes'])} {r['prediction_error']:6.1%} "
                f"{_fmt_bytes(r['allocator_peak_bytes'])} {fmt_spread(r):>24} "
                f"{r['step_over_hand']:6.2f} {r['hfu_over_mfu']:8.3f} "
                f"{r['model_gflop_per_s']:8.2f}")
        if with_torch:
            line += (f" {fmt_spread(r, 'torch_step'):>24} "
                     f"{_fmt_bytes(r.get('torch_saved_peak_bytes'))}")
        lines.append(line)
    lines.append("peaks: saved-activation bytes (ledger; torch: saved_tensors_hooks), allocator: "
                 "tracemalloc/CuPy pool; step: median [25th-75th percentile] of interleaved "
                 "repeats; /hand: step median / by-hand median; GFLOP/s: model FLOPs")
    lines += torch_notes(rows, with_torch)
    if r0["model"] == "mlp" and any(r["schedule"].startswith("keep(") for r in rows):
        lines.append("keep(matmul) on this ReLU MLP holds more than none: it keeps both matmul "
                     "outputs, the first the size of ReLU's output (which none keeps instead), "
                     "the second one none never keeps; and its recompute makes ReLU's output "
                     "again on top")
    warning = overlap_warning(rows)
    if warning:
        lines.append(warning)
    faster = tradeoff.faster_than_baseline(time_points(rows))
    if faster:
        lines.append(f"note: {faster}")
    return "\n".join(lines)


def torch_notes(rows: list[dict], with_torch: bool) -> list[str]:
    """Why the PyTorch twin has no number: one line per reason, naming the rows."""
    reasons = {}
    for r in rows:
        if "torch_note" in r:
            reasons.setdefault(r["torch_note"], []).append(r["schedule"])
    head = [] if with_torch or not reasons else ["PyTorch twin (torch step, torch saved) not run"]
    return head + [f"torch '-' for {', '.join(names)}: {why}" for why, names in reasons.items()]


def figures(rows: list[dict], folder) -> list:
    """Peak memory (the ledger's) against measured step time, with its IQR, and against
    recompute FLOPs: one point per schedule. Returns the PNG paths."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    sched = [r for r in rows if "measured_peak_bytes" in r]
    paths = [out / "checkpoint_memory_vs_time.png", out / "checkpoint_pareto.png"]
    plots.plot_memory_vs_time(time_points(rows), device=rows[0]["device"], path=paths[0])
    plots.plot_pareto([dict(name=r["schedule"], peak_bytes=r["measured_peak_bytes"],
                            recompute_flops=r["hardware_flops"] - r["model_flops"])
                       for r in sched], path=paths[1])
    return paths
