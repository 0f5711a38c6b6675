"""The main job: `python -m ckptlab tour`. On the emulator it takes 26 s of CPU time (measured:
24.5 s user + 1.4 s system, kernels already compiled) and 20 s of wall time on an idle 2-core
machine (a launch's blocks run on both cores); the first run also compiles the kernels (34 s),
and a busy machine stretches the wall time (206 s with the 2 cores shared by a dozen other
jobs).

Three parts, each printed as a table and written as CSV, with the figures as PNG, to --out:

1. gradient checks: every kernel (naive; flash with atomic and deterministic dQ), causal and
   not, dropout and not, on a small odd problem, against float64 (ckptlab.cli.check);
2. naive, stored and flash attention over a sweep of N (ckptlab.cli.bench_attention): FLOPs
   (model / hardware), HBM bytes counted and unique, bytes saved for the backward, times modeled
   on an A100 and an H200 (and measured on a GPU), and per N the decomposition: fusion gain
   (naive / stored) x recompute gain (stored / flash) = naive / flash;
3. the checkpoint schedules on a small model (ckptlab.cli.bench_checkpoint): peak saved bytes,
   recompute FLOPs, step time with its spread; peak memory against step time and against
   recompute FLOPs, and memory over one step on one clock (the work done so far).

Sizes are chosen per target: on the emulator small enough to count every byte in well under a
minute of CPU time; on a GPU larger, with CUDA-event times. --n/--batch/--heads override them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ckptlab import device, engine
from ckptlab.cli import attention_figures as figures_of_attention
from ckptlab.cli import bench_attention, bench_checkpoint, check, checkpoint_report
from ckptlab.cli.report import (
    TooBig,
    check_fits,
    int_list,
    positive_int,
    writable_folder,
    write_csv,
)
from ckptlab.engine import Tensor
from ckptlab.measure import memory_speed, plots, roofline, timemodel
from ckptlab.recompute import ledger, schedules

# per target: the sweep of N and the (B, H, d) of every run. Emulator: every byte counted; N=1024
# costs ~3 s for the three methods on 2 cores, the whole sweep ~6 s (~35 s with N=2048, which took
# 166 s with both cores contended, hence 1024). GPU: 16 heads up to N=4096, ~0.2-0.5 TFLOP per
# forward + backward (naive holds 3 N x N matrices at once there: 3.2 GB).
SIZES = {
    "emu": dict(ns=[64, 128, 256, 512, 1024], B=1, H=1, d=64),
    "cuda": dict(ns=[256, 512, 1024, 2048, 4096], B=1, H=16, d=64),
    "quick": dict(ns=[32, 64], B=1, H=1, d=64),
}


def part_checks() -> list[dict]:
    """Part 1: ckptlab.cli.check on one small odd problem (all kernels, causal x dropout)."""
    return check.run(check.QUICK_SIZES)


def fitting(ns, B, H, d) -> tuple[list, list]:
    """(sizes that fit in free memory for every method, the ones dropped with the reason)."""
    keep, dropped = [], []
    for n in ns:
        try:
            for impl in bench_attention.IMPLS:
                check_fits(impl, B, H, n, d)
            keep.append(n)
        except TooBig as e:
            dropped.append(str(e))
    return keep, dropped


def part_sweep(ns, B, H, d, repeats: int) -> list[dict]:
    """Part 2: naive, stored and flash forward + backward at every N."""
    return bench_attention.sweep(ns, bench_attention.IMPLS, B=B, H=H, d=d, repeats=repeats)


# Part 3: an 8-block GPT (width 64, batch 8): every schedule, 7 interleaved repeats, in ~10 s on
# 2 cores. A transformer, not the MLP, because keeping matmul outputs only pays where cheap ops
# hold big activations (in a ReLU MLP the matmul outputs it keeps are extra). Quick: an MLP.
CKPT = dict(model="gpt", layers=8, width=64, batch=8, repeats=7,
            schedules=["none", "sqrt", "every(2)", "revolve(2)", "chen_greedy(25%)",
                       "optimal(40%)", "keep(matmul)", "recompute(attn)"])
CKPT_QUICK = dict(model="mlp", layers=4, width=16, batch=8, repeats=1,
                  schedules=["none", "sqrt", "revolve(1)"])
TRACED = ("none", "sqrt", "revolve(2)")  # schedules drawn in the memory-over-time figure


def part_checkpoint(c: dict) -> list[dict]:
    """Part 3: ckptlab.cli.bench_checkpoint's rows (a by-hand NumPy row, then one per
    schedule)."""
    return bench_checkpoint.run(c["model"], c["layers"], c["schedules"], width=c["width"],
                                batch=c["batch"], repeats=c["repeats"], with_torch=False)


def memory_traces(c: dict) -> tuple[dict, list]:
    """Saved bytes after every acquire/release of one training step (the ledger's timeline), per
    traced schedule; the hardware FLOPs done at each (one clock for all); and the first one's
    (start, end, phase) spans."""
    m, x, y = bench_checkpoint.build(c["model"], layers=c["layers"], width=c["width"],
                                     batch=c["batch"])
    prof = m.profile(x, y)
    traces, clocks, spans = {}, {}, None
    for spec in [s for s in c["schedules"] if s in TRACED]:
        sched = schedules.make(spec, prof=prof)
        engine.manual_seed(0)
        m.zero_grad()
        with ledger.record() as led:
            m.loss(Tensor(x), y, schedule=sched).backward()
        values, phases = led.timeline()
        traces[sched.name], clocks[sched.name] = values, led.flops_clock()
        spans = phases if spans is None else spans
    return traces, clocks, spans


def checkpoint_figures(rows: list[dict], c: dict, out: Path) -> list[Path]:
    """Memory over one step (every schedule on the same FLOP clock); peak memory against the
    measured step time (with its IQR) and against recompute FLOPs (checkpoint_report.figures)."""
    traces, clocks, spans = memory_traces(c)
    trace = out / "checkpoint_memory_trace.png"
    plots.plot_memory_trace(traces, spans, clocks=clocks, path=trace)
    return [trace, *checkpoint_report.figures(rows, out)]


# ---------------------------------------------------------------- figures


def roofline_points(rows: list[dict]) -> list[dict]:
    """Each method's forward + backward at the largest N on the roofline, at its modeled FLOPs
    and counted bytes (hollow marker: on the roof). One point per method, not per kernel: the
    naive matmuls share one intensity and their labels would sit on each other, and the
    row-wise kernels have no matmul FLOPs (intensity 0: off a log axis); their bytes still count
    here. On a GPU each method is placed again at its measured time (filled marker)."""
    big = max(r["N"] for r in rows)
    points = []
    for r in (r for r in rows if r["N"] == big):
        points.append(dict(name=f"{r['impl']} ({r['launches']} kernels)",
                           flops=r["hardware_flops"], bytes=r["modeled_counted_bytes"]))
        if r["target"] == "cuda":
            points.append(dict(name=f"{r['impl']}, measured", flops=r["hardware_flops"],
                               bytes=r["counted_bytes"], seconds=r["time_s"]))
    return points


def roofline_title(points: list[dict], spec_name: str, n: int) -> str:
    ridge = roofline.ridge_point(spec_name, "fp32")
    memory = [p["name"].split(" (")[0] for p in points
              if "measured" not in p["name"] and p["flops"] / p["bytes"] < ridge]
    return (f"at N={n}, counted bytes: memory-bound on {spec_name} (fp32 ridge {ridge:.3g} "
            "FLOP/byte): " + (", ".join(memory) if memory else "none"))


def attention_figures(rows: list[dict], out: Path) -> list[Path]:
    """Memory, time and HBM bytes against N, the roofline, and memory against speed; returns
    the PNG paths."""
    ns = sorted({r["N"] for r in rows})
    by = {impl: [r for r in rows if r["impl"] == impl] for impl in bench_attention.IMPLS}
    r0 = rows[0]
    gpu = r0["modeled_gpus"].split(",")[0]
    g = timemodel.short_name(gpu)
    paths = [out / "attention_memory_vs_n.png", out / "attention_time_vs_n.png",
             out / "attention_roofline.png"]
    held = {"naive": "naive (P)", "stored": "stored (P's tiles, L)", "flash": "flash (O, L)"}
    plots.plot_memory_vs_n(ns, {held[m]: [r["saved_bytes"] for r in by[m]] for m in by},
                           what="memory held for backward", path=paths[0])
    if r0["target"] == "cuda":
        where = r0["time_source"].split(";")[0].removeprefix("measured (") + " (measured)"
        plots.plot_time_vs_n(ns, {m: [r["time_s"] for r in by[m]] for m in by}, device=where,
                             path=paths[1])
    else:  # no GPU: modeled, at sizes where every launch fills the GPU's waves (at the sweep's
        # toy sizes the model would mostly count launch costs and partial waves)
        n0 = memory_speed.at_scale_size([gpu], r0["d"])
        B, H, big = memory_speed.AT_SCALE["B"], memory_speed.AT_SCALE["H"], [n0, 2 * n0, 4 * n0]
        plots.plot_time_vs_n(big, {m: [timemodel.method_time(m, B, H, n, n, r0["d"], gpu).lower
                                      for n in big] for m in by}, path=paths[1],
                             device=f"{g}, MODELED at B={B} H={H} d={r0['d']} (unique bytes; "
                                    "every launch fills its waves), not measured")
    points = roofline_points(rows)
    plots.plot_roofline(points, gpu, path=paths[2], title=roofline_title(points, gpu, ns[-1]))
    return paths + figures_of_attention.figures(rows, out)


def sweep_notes(rows: list[dict]) -> str:
    """What the sweep shows, in numbers taken from it (largest N)."""
    big = max(r["N"] for r in rows)
    n, s, f = (next(r for r in rows if r["N"] == big and r["impl"] == m)
               for m in bench_attention.IMPLS)
    gpu = n["modeled_gpus"].split(",")[0]
    g = timemodel.short_name(gpu)
    ridge = roofline.ridge_point(gpu, "fp32")
    lines = [
        f"at N={big}: fusion (naive -> stored) cuts counted bytes "
        f"{n['counted_bytes'] / s['counted_bytes']:.1f}x with P still stored; recompute "
        f"(stored -> flash) cuts them {s['counted_bytes'] / f['counted_bytes']:.2f}x more and the "
        f"saved bytes {s['saved_bytes'] / f['saved_bytes']:.1f}x, for "
        f"{f['recompute_flops'] / 1e6:.1f} MFLOP of recompute "
        f"({f['hardware_flops'] / s['hardware_flops']:.2f}x stored's FLOPs)",
        f"arithmetic intensity (FLOP per counted byte): naive "
        f"{n['hardware_flops'] / n['counted_bytes']:.2f}, stored "
        f"{s['hardware_flops'] / s['counted_bytes']:.2f}, flash "
        f"{f['hardware_flops'] / f['counted_bytes']:.2f}; the {gpu} fp32 ridge is {ridge:.2f}",
        f"recompute gain in time (stored / flash), modeled on {g}: "
        f"{s[f'{g}_lo_s'] / f[f'{g}_lo_s']:.2f} (unique bytes) to "
        f"{s[f'{g}_hi_s'] / f[f'{g}_hi_s']:.2f} (counted); where it crosses 1: "
        "`python -m ckptlab bench crossing`",
    ]
    if rows[0]["target"] == "emu":
        ok = all(r["counted_bytes"] == r["modeled_counted_bytes"]
                 and r["unique_bytes"] == r["modeled_unique_bytes"] for r in rows)
        lines.append("counted and unique bytes == their models (ckptlab.measure.traffic) on "
                     "every row: " + ("yes" if ok else "NO"))
    return "\n".join(lines)


# ---------------------------------------------------------------- the job


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ckptlab tour", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="ckptlab-results", help="output folder (default "
                   "./ckptlab-results)")
    p.add_argument("--quick", action="store_true", help="tiny sizes (seconds): for tests")
    p.add_argument("--n", type=int_list, help="sweep of N, e.g. 64,128,256")
    p.add_argument("--batch", type=positive_int, help="B of the sweep")
    p.add_argument("--heads", type=positive_int, help="H of the sweep")
    p.add_argument("--repeats", type=positive_int, default=20, help="timed repeats on a GPU")
    a = p.parse_args(argv)
    target = device.target()
    size = dict(SIZES["quick" if a.quick else target])
    for key, value in (("ns", a.n), ("B", a.batch), ("H", a.heads)):
        if value is not None:
            size[key] = value
    if len(size["ns"]) < 2:
        p.error("--n needs at least two sizes (slopes are fitted)")
    ns, dropped = fitting(size["ns"], size["B"], size["H"], size["d"])  # before any work
    if len(ns) < 2:
        p.error(f"fewer than two sizes of the sweep fit: {dropped[0]}")
    out = writable_folder(a.out)
    t0 = time.perf_counter()
    written = []

    print(f"== ckptlab tour on target {target!r} ==\n")
    print("-- 1. gradient checks: every kernel vs float64 reference --")
    checks = part_checks()
    print(check.format_table(checks))
    write_csv(checks, out / "tour_checks.csv")
    written.append(out / "tour_checks.csv")

    print("\n-- 2. naive -> stored -> flash: what fusion buys, then what recompute buys --")
    for reason in dropped:
        print(f"skipped: {reason}")
    rows = part_sweep(ns, size["B"], size["H"], size["d"], a.repeats)
    print(bench_attention.format_table(rows))
    print(sweep_notes(rows))
    write_csv(rows, out / "tour_attention.csv")
    write_csv(bench_attention.decompose(rows), out / "tour_decomposition.csv")
    written += [out / "tour_attention.csv", out / "tour_decomposition.csv",
                *attention_figures(rows, out)]

    c = CKPT_QUICK if a.quick else CKPT
    print(f"\n-- 3. checkpoint schedules on a small model ({c['model']}, {c['layers']} blocks) --")
    ck_rows = part_checkpoint(c)
    print(bench_checkpoint_table(ck_rows))
    write_csv(ck_rows, out / "tour_checkpoint.csv")
    written += [out / "tour_checkpoint.csv", *checkpoint_figures(ck_rows, c, out)]

    print(f"\nwrote ({time.perf_counter() - t0:.0f} s):")
    for path in written:
        print(f"  {path}")
    ok = all(r["ok"] for r in checks) and all(
        r["counted_bytes"] == r["modeled_counted_bytes"] for r in rows
        if r["bytes_source"] == "counted")
    return 0 if ok else 1


def bench_checkpoint_table(rows: list[dict]) -> str:
    """bench_checkpoint's table, and the recompute FLOPs each schedule paid."""
    extra = ["recompute FLOPs per step (hardware - model): " + ", ".join(
        f"{r['schedule']} {(r['hardware_flops'] - r['model_flops']) / 1e6:.1f} M"
        for r in rows if "hardware_flops" in r)]
    if rows[0].get("model") == "gpt":
        extra.append("'none' recomputes too: the model's flash attention rebuilds S = Q K^T in "
                     "its backward; keep(matmul) checkpoints each block but keeps its matmul "
                     "outputs, redoing layernorm, GELU and the attention core; recompute(attn) "
                     "(Korthikanti et al.) checkpoints nothing but the attention core, which "
                     "flash already keeps small (O and L), so here it saves little")
    return checkpoint_report.table(rows) + "\n" + "\n".join(extra)


if __name__ == "__main__":
    sys.exit(main())
