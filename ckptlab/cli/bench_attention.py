"""Naive, stored and flash attention, measured: `python -m ckptlab bench attention --n 64,128`

Three methods that differ one thing at a time: naive (unfused, S and P through HBM), stored
(fused on the flash tiles, P's tile data written once and read back), flash (the same tiles, P
recomputed from L). One row per (method, N): forward + backward of one attention layer.

    FLOPs       model (useful work: 4 d per visible (i, j) pair forward, 8 d backward) and hardware
                (what runs, recompute included), matmuls only (ckptlab.measure.traffic)
    HBM bytes   counted (every request, no cache: the emulator's count, or on a GPU the model of
                it) and unique (the distinct bytes each launch touches: what an ideal cache would
                move). Real DRAM traffic lies between the two; with --ncu on a GPU, Nsight
                Compute's measured bytes stand beside both.
    saved       the bytes the forward keeps for the backward (the wrappers' ledger)
    time        modeled on each --gpus GPU (ckptlab.measure.timemodel: launch cost + waves x
                roofline; lower bound from unique bytes, upper from counted); on a GPU also
                measured (CUDA events, median and p10-p90 of repeats)
    gains       per N: fusion gain = naive / stored, recompute gain = stored / flash, product =
                naive / flash, for bytes, saved bytes, FLOPs and times (> 1: the second is cheaper)

--png [DIR] draws into the folder DIR (the current one when not given), as bench checkpoint's
--png does: attention_memory_vs_speed.png, memory against speed where the bargain holds (saved
bytes against modeled time at a size where every launch fills the GPU's waves and S exceeds the
L2: ckptlab.measure.memory_speed), beside the model's check at the sizes that ran (counted
against modeled bytes on the emulator, measured against modeled time on a GPU); and
attention_bytes_vs_n.png, the bytes against N.
"""

from __future__ import annotations

import argparse
import sys

from tqdm import tqdm

from ckptlab import device, emu, kernels, measure
from ckptlab.cli.attention_figures import FIGURES, figures
from ckptlab.cli.report import (
    check_fits,
    fmt_bytes,
    fmt_seconds,
    int_list,
    positive_int,
    writable_file,
    writable_folder,
    write_csv,
)
from ckptlab.measure import roofline, timemodel, traffic

IMPLS = timemodel.CHAIN  # naive, stored, flash
DEFAULT_GPUS = ("A100-SXM4-80GB", "H200-SXM-141GB")
short = timemodel.short_name  # 'A100-SXM4-80GB' -> 'A100': column labels and CSV key prefixes
BYTES_NOTE = ("bytes: real DRAM traffic lies between unique (the distinct bytes each launch "
              "touches: an ideal cache) and counted (every request: no cache)")


# ---------------------------------------------------------------- one measurement


def forward_backward(impl: str, q, k, v, dO, causal=False, deterministic=False):
    """One forward and one backward through the wrappers; returns (saved, (dQ, dK, dV))."""
    _, saved = kernels.forward(impl, q, k, v, causal=causal)
    return saved, kernels.backward(impl, dO, q, k, v, saved, deterministic)


def _emu_bytes(rec) -> tuple[int, int]:
    """(counted, unique) global bytes of a recording, summed over launches and arguments."""
    args = [a for x in rec.launches for a in x.args.values()]
    counted = sum(a.read_bytes + a.write_bytes + a.atomic_bytes for a in args)
    unique = sum(a.unique_read_bytes + a.unique_write_bytes for a in args)
    return counted, unique


def run_case(impl: str, B, H, N, d, causal=False, deterministic=False, *, repeats: int = 20,
             gpus=DEFAULT_GPUS) -> dict:
    """Measure one forward + backward; one row (see the module docstring for each column)."""
    if impl not in IMPLS:
        raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")
    target = device.target()
    check_fits(impl, B, H, N, d, target)
    runs = traffic.launches(impl, B, H, N, N, d, causal, deterministic)
    model = traffic.totals(runs)
    q, k, v, dO = kernels.random_inputs(B, H, N, d)
    row = dict(target=target, impl=impl, B=B, H=H, N=N, d=d, causal=causal,
               deterministic=deterministic,
               model_flops=traffic.model_flops(B, H, N, N, d, causal)
               + traffic.model_flops(B, H, N, N, d, causal, backward=True),
               hardware_flops=model["flops"], recompute_flops=model["recompute_flops"],
               modeled_counted_bytes=model["bytes"], modeled_unique_bytes=model["unique_bytes"],
               launches=len(runs))
    held = {}

    def once():
        held["saved"], _ = forward_backward(impl, q, k, v, dO, causal, deterministic)

    if target == "emu":
        with emu.record() as rec:
            row["alloc_peak_bytes"] = measure.peak_memory(once)
        counted = all(x.counted for x in rec.launches)  # mode "fast" counts nothing
        row["bytes_source"] = "counted" if counted else "modeled"
        row["counted_bytes"], row["unique_bytes"] = (
            _emu_bytes(rec) if counted else (row["modeled_counted_bytes"],
                                             row["modeled_unique_bytes"]))
        row["emu_seconds"] = rec.seconds
    else:
        with kernels.unpoisoned():  # time the kernels, not the NaN fills of the outputs
            t = measure.time_fn(once, repeats=repeats, warmup=2)
        row["alloc_peak_bytes"] = measure.peak_memory(once)
        row.update(counted_bytes=row["modeled_counted_bytes"],
                   unique_bytes=row["modeled_unique_bytes"], bytes_source="modeled",
                   time_s=t.median_s, time_p10_s=t.p10_s, time_p90_s=t.p90_s,
                   time_source=f"measured ({t.device}; {t.method})")
    row["alloc_source"] = "CuPy pool peak" if target == "cuda" else "tracemalloc peak"
    row["saved_bytes"] = held["saved"].nbytes
    for gpu in gpus:
        m = timemodel.method_time(impl, B, H, N, N, d, gpu, causal=causal,
                                  deterministic=deterministic)
        row.update({f"{short(m.device)}_lo_s": m.lower, f"{short(m.device)}_hi_s": m.upper})
    row["modeled_gpus"] = ",".join(roofline.spec(g)["name"] for g in gpus)
    return row


def sweep(ns, impls=IMPLS, *, B=1, H=1, d=64, causal=False, deterministic=False, repeats=20,
          gpus=DEFAULT_GPUS, progress=True, counted=True) -> list[dict]:
    """run_case for every N and method (emulator: counted, race check off, for speed)."""
    jobs = [(n, impl) for n in ns for impl in impls]
    for n, impl in jobs:  # refuse before running anything
        check_fits(impl, B, H, n, d)
    rows = []
    mode = dict(mode="counted" if counted else "fast", race_check=False)
    bar = tqdm(jobs, desc=f"naive / stored / flash ({device.target()})", unit="run",
               disable=not progress, file=sys.stderr, leave=False)
    with emu.settings(**mode):
        for n, impl in bar:
            bar.set_postfix_str(f"{impl} N={n}")
            rows.append(run_case(impl, B, H, n, d, causal, deterministic, repeats=repeats,
                                 gpus=gpus))
    return rows


# ---------------------------------------------------------------- the decomposition


def quantities(rows: list[dict], modeled_times: bool = True) -> dict:
    """What the gains are taken of: label -> row key (those every row has); without the modeled
    times when modeled_times is False."""
    r0 = rows[0]
    q = {"counted bytes": "counted_bytes", "unique bytes": "unique_bytes",
         "saved for backward": "saved_bytes", "hardware FLOPs": "hardware_flops"}
    if "measured_bytes" in r0:
        q["measured bytes (ncu)"] = "measured_bytes"
    for gpu in r0["modeled_gpus"].split(",") if modeled_times else ():
        q[f"{short(gpu)} modeled time, lower"] = f"{short(gpu)}_lo_s"
        q[f"{short(gpu)} modeled time, upper"] = f"{short(gpu)}_hi_s"
    if "time_s" in r0:
        q["measured time"] = "time_s"
    return q


def decompose(rows: list[dict], modeled_times: bool = True) -> list[dict]:
    """Per N with all three methods, per quantity: the three values and the fusion, recompute
    and product gains (timemodel.decomposition)."""
    out = []
    for n in dict.fromkeys(r["N"] for r in rows):
        by = {r["impl"]: r for r in rows if r["N"] == n}
        if not all(m in by for m in IMPLS):
            continue
        for label, key in quantities(rows, modeled_times).items():
            values = {m: by[m][key] for m in IMPLS}
            out.append(dict(N=n, quantity=label, **values, **timemodel.decomposition(values)))
    return out


# ---------------------------------------------------------------- Nsight Compute


NCU_CODE = """\
from ckptlab import device, kernels
from ckptlab.cli import bench_attention as b
device.use('cuda')
q, k, v, dO = kernels.random_inputs({B}, {H}, {N}, {d})
b.forward_backward({impl!r}, q, k, v, dO, {causal}, {deterministic})
device.synchronize()
"""


def add_measured_bytes(rows: list[dict], timeout_s: float = 300) -> None:
    """Profile each row's forward + backward in a subprocess under ncu; sets measured_bytes (the
    sum of DRAM bytes read and written over every attn_ kernel launch)."""
    for r in tqdm(rows, desc="ncu: measured HBM bytes", file=sys.stderr, leave=False):
        fields = {k: r.get(k, False) for k in ("B", "H", "N", "d", "impl", "causal",
                                               "deterministic")}
        launches = measure.measure_hbm_bytes(NCU_CODE.format(**fields), kernel_regex="attn_",
                                             timeout_s=timeout_s)
        r["measured_bytes"] = sum(x["bytes_total"] for x in launches)


# ---------------------------------------------------------------- output


def _span(lo, hi) -> str:
    return f"{fmt_seconds(lo)}-{fmt_seconds(hi)}"


def format_table(rows: list[dict], modeled_times: bool = True) -> str:
    """The sweep as text: one line per (N, method), then the gains per N, then what they mean.
    modeled_times=False leaves out the modeled times (at toy sizes mostly launch costs: a lab
    that counts bytes prints them without)."""
    r0 = rows[0]
    gpus = [short(g) for g in r0["modeled_gpus"].split(",")] if modeled_times else []
    measured = "measured_bytes" in r0
    head = (f"{'N':>6} {'method':<8}{'model GFLOP':>12}{'hw GFLOP':>10}"
            f"{'counted B':>12}{'unique B':>12}" + (f"{'ncu B':>12}" if measured else "")
            + f"{'saved':>11}" + "".join(f"{g + ' modeled':>22}" for g in gpus)
            + (f"{'measured (p10-p90)':>30}" if "time_s" in r0 else ""))
    out = [head, "-" * len(head)]
    for r in rows:
        line = (f"{r['N']:>6} {r['impl']:<8}{r['model_flops'] / 1e9:>12.4g}"
                f"{r['hardware_flops'] / 1e9:>10.4g}{fmt_bytes(r['counted_bytes']):>12}"
                f"{fmt_bytes(r['unique_bytes']):>12}")
        if measured:
            line += f"{fmt_bytes(r['measured_bytes']):>12}"
        line += f"{fmt_bytes(r['saved_bytes']):>11}"
        line += "".join(f"{_span(r[f'{g}_lo_s'], r[f'{g}_hi_s']):>22}" for g in gpus)
        if "time_s" in r:
            line += (f"{fmt_seconds(r['time_s']):>12} ({_span(r['time_p10_s'], r['time_p90_s'])})")
        out.append(line)
    gains = decompose(rows, modeled_times)
    for n in dict.fromkeys(g["N"] for g in gains):
        out.append(f"\nN={n}: gains (> 1: the second method is cheaper)"
                   f"{'fusion naive/stored':>24}{'recompute stored/flash':>25}"
                   f"{'product naive/flash':>22}")
        for g in (g for g in gains if g["N"] == n):
            out.append(f"  {g['quantity']:<44}{g['fusion']:>22.2f}x{g['recompute']:>24.2f}x"
                       f"{g['product']:>21.2f}x")
    shape = (f"B={r0['B']} H={r0['H']} d={r0['d']} {'causal' if r0['causal'] else 'non-causal'}"
             f"{', deterministic dQ' if r0['deterministic'] else ''}")
    counted = ("counted by the emulator" if r0["bytes_source"] == "counted"
               else "modeled (ckptlab.measure.traffic)")
    out += [f"forward + backward, {shape}, fp32 kernels on target {r0['target']!r}; bytes "
            f"{counted}" + ("; ncu B: measured by Nsight Compute" if measured else ""),
            BYTES_NOTE + ("" if measured else "; on a GPU, --ncu measures them"),
            *(f"{k}: {v}" for k, v in timemodel.WHAT_DIFFERS.items())]
    if modeled_times:
        out.append(model_note(rows))
    return "\n".join(out)


def model_note(rows: list[dict]) -> str:
    """What the modeled times are, and from what N on they mean something."""
    r0 = rows[0]
    gpu = r0["modeled_gpus"].split(",")[0]
    n = timemodel.fills_waves_from(r0["B"], r0["H"], r0["d"], gpu,
                                   sorted({r["impl"] for r in rows}), causal=r0["causal"],
                                   deterministic=r0["deterministic"])
    where = f"N >= {n}" if n else "no N tried"
    small = max(r["N"] for r in rows) < (n or float("inf"))
    return (f"times modeled (lower-upper: unique-counted bytes): launch cost "
            f"{timemodel.LAUNCH_S * 1e6:.0f} us + waves x roofline, ckptlab.measure.timemodel; "
            f"registers and shared memory: {timemodel.resources_note(gpu)}; "
            f"at B={r0['B']} H={r0['H']} every launch fills a wave on {short(gpu)} from {where}"
            + ("; below that the model mostly counts launch costs and partial waves: a guide, "
               "not a prediction" if small else ""))


def impl_list(text: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in values if x not in IMPLS]
    if bad or not values:
        raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {IMPLS}, "
                                         f"got {text!r}")
    return values


def gpu_list(text: str) -> list[str]:
    try:
        names = [roofline.spec(g)["name"] for g in text.split(",") if g.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated GPU names from "
                                         f"{sorted(roofline.SPECS)}, got {text!r}")
    return names


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ckptlab bench attention", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int_list, default=[64, 128, 256], help="sequence lengths, 64,128")
    p.add_argument("--d", type=int, default=64, choices=kernels.HEAD_DIMS, help="head dim")
    p.add_argument("--batch", type=positive_int, default=1, help="B (default 1)")
    p.add_argument("--heads", type=positive_int, default=1, help="H (default 1)")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--deterministic", action="store_true", help="stored and flash: dQ without "
                   "atomics (a second kernel)")
    p.add_argument("--impl", type=impl_list, default=list(IMPLS),
                   help=f"comma-separated, from {IMPLS} (default all three)")
    p.add_argument("--repeats", type=positive_int, default=20,
                   help="timed repeats on a GPU (>= 1)")
    p.add_argument("--gpus", type=gpu_list, default=list(DEFAULT_GPUS), help="GPUs for the "
                   f"modeled times, comma-separated, from {sorted(roofline.SPECS)}")
    p.add_argument("--ncu", action="store_true", help="also measure DRAM bytes with Nsight "
                   "Compute (GPU and ncu needed)")
    p.add_argument("--csv", metavar="FILE", help="write the rows as CSV ('-': stdout, and the "
                   "table goes to stderr)")
    p.add_argument("--png", metavar="DIR", nargs="?", const=".",
                   help=f"draw {' and '.join(FIGURES)} into the folder DIR (default: the current "
                   "one): memory against speed at a size where it means something, beside the "
                   "model's check")
    a = p.parse_args(argv)
    if a.csv is not None:  # before any work
        writable_file(a.csv)
    if a.png == "-":
        p.error("--png -: figures go to a folder, not to stdout; name a folder")
    if a.png is not None:
        writable_folder(a.png, "--png")
    if a.ncu and not (device.target() == "cuda" and measure.ncu_available()):
        p.error("--ncu needs the cuda target and `ncu` (Nsight Compute) on the PATH")
    rows = sweep(a.n, a.impl, B=a.batch, H=a.heads, d=a.d, causal=a.causal,
                 deterministic=a.deterministic, repeats=a.repeats, gpus=a.gpus)
    if a.ncu:
        try:
            add_measured_bytes(rows)
        except (RuntimeError, ValueError) as e:  # no counters permission, no kernel matched...
            first = str(e).strip().splitlines()
            print(f"ncu could not measure: {' | '.join(first[:3])}", file=sys.stderr)
            return 1
    print(format_table(rows), file=sys.stderr if a.csv == "-" else sys.stdout)
    if a.csv is not None:
        write_csv(rows, a.csv)
    if a.png is not None:
        for path in figures(rows, a.png):
            print(f"wrote {path}", file=sys.stderr if a.csv == "-" else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
