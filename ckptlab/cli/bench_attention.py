"""Store-P against recompute, measured: `python -m ckptlab bench attention --n 64,128`

One row per (method, N): forward + backward of one attention layer with every number labelled:

    FLOPs       model (useful work: 4 d per visible (i, j) pair forward, 8 d backward) and hardware
                (what runs, recompute included), from ckptlab.measure.traffic
    HBM bytes   counted by the emulator (source "counted"), or on a GPU the formula of
                ckptlab.measure.traffic ("modeled"); Nsight Compute's DRAM bytes ("measured")
                with --ncu
    saved       the bytes the forward keeps for the backward (the wrappers' ledger): P (N x N) for
                naive, O and L for flash
    time        on a GPU: measured (CUDA events, median of repeats); on the emulator: modeled on a
                named GPU, max(hardware FLOPs / peak, bytes / bandwidth), labelled "modeled"
    ratios      memory ratio = naive saved / flash saved; speed-up = naive time / flash time

Sizes are checked against free memory (host RAM or the GPU's) before anything is allocated.
"""

from __future__ import annotations

import argparse
import sys

from tqdm import tqdm

from ckptlab import device, emu, kernels, measure
from ckptlab.cli.report import (
    check_fits,
    fmt_bytes,
    fmt_seconds,
    int_list,
    positive_int,
    writable_file,
    write_csv,
)
from ckptlab.measure import roofline, traffic

IMPLS = traffic.METHODS  # naive, flash, flash-det (the deterministic dQ backward)
DEFAULT_SPEC = "A100-SXM4-80GB"


# ---------------------------------------------------------------- one measurement


def forward_backward(impl: str, q, k, v, dO, causal=False):
    """One forward and one backward through the wrappers; returns (saved, (dQ, dK, dV))."""
    if impl == "naive":
        _, saved = kernels.naive_forward(q, k, v, causal=causal)
        return saved, kernels.naive_backward(dO, q, k, v, saved)
    _, saved = kernels.flash_forward(q, k, v, causal=causal)
    return saved, kernels.flash_backward(dO, q, k, v, saved, deterministic=impl == "flash-det")


def run_case(impl: str, B, H, N, d, causal=False, *, repeats: int = 20, spec=None) -> dict:
    """Measure one forward + backward; one row (see the module docstring for each column)."""
    if impl not in IMPLS:
        raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")
    target = device.target()
    check_fits(impl, B, H, N, d, target)
    launches = traffic.launches(impl, B, H, N, N, d, causal)
    model = traffic.totals(launches)
    q, k, v, dO = kernels.random_inputs(B, H, N, d)
    row = dict(target=target, impl=impl, B=B, H=H, N=N, d=d, causal=causal,
               model_flops=traffic.model_flops(B, H, N, N, d, causal)
               + traffic.model_flops(B, H, N, N, d, causal, backward=True),
               hardware_flops=model["flops"], recompute_flops=model["recompute_flops"],
               modeled_bytes=model["bytes"])
    held = {}

    def once():
        held["saved"], _ = forward_backward(impl, q, k, v, dO, causal)

    if target == "emu":
        with emu.record() as rec:
            row["alloc_peak_bytes"] = measure.peak_memory(once)
        row["hbm_bytes"] = sum(x.global_read_bytes + x.global_write_bytes + x.atomic_bytes
                               for x in rec.launches)
        row["hbm_source"] = "counted" if all(x.counted for x in rec.launches) else "modeled"
        if row["hbm_source"] == "modeled":  # mode "fast" counts nothing: fall back, say so
            row["hbm_bytes"] = model["bytes"]
        row["emu_seconds"] = rec.seconds
        spec = spec or DEFAULT_SPEC
    else:
        with kernels.unpoisoned():  # time the kernels, not the NaN fills of the outputs
            t = measure.time_fn(once, repeats=repeats, warmup=2)
        row["alloc_peak_bytes"] = measure.peak_memory(once)
        row.update(hbm_bytes=model["bytes"], hbm_source="modeled", time_s=t.median_s,
                   time_p10_s=t.p10_s, time_p90_s=t.p90_s,
                   time_source=f"measured ({t.device}; {t.method})")
        spec = spec or roofline.current_gpu() or DEFAULT_SPEC
    row["alloc_source"] = "CuPy pool peak" if target == "cuda" else "tracemalloc peak"
    row["saved_bytes"] = held["saved"].nbytes
    m = roofline.modeled_time(row["hardware_flops"], row["hbm_bytes"], spec, "fp32")
    row.update(modeled_s=m.seconds, modeled_bound=m.bound, modeled_device=m.device)
    if target == "emu":
        row.update(time_s=m.seconds, time_source=f"modeled ({m.device}, fp32 roofline)")
    return row


def sweep(ns, impls=("naive", "flash"), *, B=1, H=1, d=64, causal=False, repeats=20,
          spec=None, progress=True, counted=True) -> list[dict]:
    """run_case for every N and method (emulator: counted, race check off, for speed)."""
    jobs = [(n, impl) for n in ns for impl in impls]
    for n, impl in jobs:  # refuse before running anything
        check_fits(impl, B, H, n, d)
    rows = []
    mode = dict(mode="counted" if counted else "fast", race_check=False)
    bar = tqdm(jobs, desc=f"store-P vs recompute ({device.target()})", unit="run",
               disable=not progress, file=sys.stderr, leave=False)
    with emu.settings(**mode):
        for n, impl in bar:
            bar.set_postfix_str(f"{impl} N={n}")
            rows.append(run_case(impl, B, H, n, d, causal, repeats=repeats, spec=spec))
    return add_ratios(rows)


def add_ratios(rows: list[dict]) -> list[dict]:
    """On each non-naive row: memory_ratio = naive saved / its saved and speedup = naive time /
    its time, against the naive row of the same N (when there is one)."""
    naive = {r["N"]: r for r in rows if r["impl"] == "naive"}
    for r in rows:
        base = naive.get(r["N"])
        ok = base is not None and r["impl"] != "naive"
        r["memory_ratio"] = base["saved_bytes"] / r["saved_bytes"] if ok else None
        r["speedup"] = base["time_s"] / r["time_s"] if ok else None
    return rows


# ---------------------------------------------------------------- Nsight Compute


NCU_CODE = """\
from ckptlab import device, kernels
from ckptlab.cli import bench_attention as b
device.use('cuda')
q, k, v, dO = kernels.random_inputs({B}, {H}, {N}, {d})
b.forward_backward({impl!r}, q, k, v, dO, {causal})
device.synchronize()
"""


def add_measured_bytes(rows: list[dict], timeout_s: float = 300) -> None:
    """Profile each row's forward + backward in a subprocess under ncu; sets measured_bytes (the
    sum of DRAM bytes read and written over every attn_ kernel launch)."""
    for r in tqdm(rows, desc="ncu: measured HBM bytes", file=sys.stderr, leave=False):
        code = NCU_CODE.format(**{k: r[k] for k in ("B", "H", "N", "d", "impl", "causal")})
        launches = measure.measure_hbm_bytes(code, kernel_regex="attn_", timeout_s=timeout_s)
        r["measured_bytes"] = sum(x["bytes_total"] for x in launches)


# ---------------------------------------------------------------- output


def format_table(rows: list[dict]) -> str:
    """The sweep as text: one line per (N, method), then what the time and bytes columns mean."""
    r0 = rows[0]
    src = r0["hbm_source"] + ("; measured: ncu" if r0.get("measured_bytes") else "")
    short = r0["modeled_device"].split("-")[0]  # "A100-SXM4-80GB" -> "A100"
    time_label = f"modeled ({short})" if r0["target"] == "emu" else "measured"
    w = 26 if r0.get("measured_bytes") else 16  # the HBM column
    head = (f"{'N':>6} {'method':<10}{'model GFLOP':>12}{'hw GFLOP':>10}{'recompute GFLOP':>16}"
            f"{'HBM (' + src + ')':>{w}}{'saved for bwd':>15}{'time, ' + time_label:>22}"
            f"{'bound':>9}"
            f"{'mem ratio':>11}{'speed-up':>10}")
    out = [head, "-" * len(head)]
    for r in rows:
        hbm = fmt_bytes(r["hbm_bytes"])
        if r.get("measured_bytes"):
            hbm += f" / {fmt_bytes(r['measured_bytes'])}"
        ratio = f"{r['memory_ratio']:.1f}x" if r.get("memory_ratio") else "-"
        speed = f"{r['speedup']:.2f}x" if r.get("speedup") else "-"
        out.append(f"{r['N']:>6} {r['impl']:<10}{r['model_flops'] / 1e9:>12.4g}"
                   f"{r['hardware_flops'] / 1e9:>10.4g}{r['recompute_flops'] / 1e9:>16.3g}"
                   f"{hbm:>{w}}{fmt_bytes(r['saved_bytes']):>15}{fmt_seconds(r['time_s']):>22}"
                   f"{r['modeled_bound']:>9}{ratio:>11}{speed:>10}")
    shape = f"B={r0['B']} H={r0['H']} d={r0['d']} {'causal' if r0['causal'] else 'non-causal'}"
    out.append(f"forward + backward, {shape}, fp32; time: {r0['time_source']}; bound: "
               f"which roofline term wins on {r0['modeled_device']}")
    out.append("mem ratio = naive saved / this method's saved; speed-up = naive time / this "
               "method's time (same N)")
    return "\n".join(out)


def impl_list(text: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in values if x not in IMPLS]
    if bad or not values:
        raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {IMPLS}, "
                                         f"got {text!r}")
    return values


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ckptlab bench attention", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int_list, default=[64, 128, 256], help="sequence lengths, 64,128")
    p.add_argument("--d", type=int, default=64, choices=kernels.HEAD_DIMS, help="head dim")
    p.add_argument("--batch", type=positive_int, default=1, help="B (default 1)")
    p.add_argument("--heads", type=positive_int, default=1, help="H (default 1)")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--impl", type=impl_list, default=["naive", "flash"],
                   help=f"comma-separated, from {IMPLS}")
    p.add_argument("--repeats", type=positive_int, default=20,
                   help="timed repeats on a GPU (>= 1)")
    p.add_argument("--spec", default=None, help="GPU for modeled times (default: this GPU, or "
                   f"{DEFAULT_SPEC} on the emulator); one of {sorted(roofline.SPECS)}")
    p.add_argument("--ncu", action="store_true", help="also measure DRAM bytes with Nsight "
                   "Compute (GPU and ncu needed)")
    p.add_argument("--csv", metavar="FILE", help="write the rows as CSV ('-': stdout, and the "
                   "table goes to stderr)")
    p.add_argument("--png", metavar="FILE", help="draw HBM bytes vs N by source to FILE")
    a = p.parse_args(argv)
    for path in (a.csv, a.png):  # before any work
        if path is not None:
            writable_file(path)
    if a.spec is not None:
        try:
            roofline.spec(a.spec)
        except ValueError as e:
            p.error(str(e))
    if a.ncu and not (device.target() == "cuda" and measure.ncu_available()):
        p.error("--ncu needs the cuda target and `ncu` (Nsight Compute) on the PATH")
    rows = sweep(a.n, a.impl, B=a.batch, H=a.heads, d=a.d, causal=a.causal, repeats=a.repeats,
                 spec=a.spec)
    if a.ncu:
        try:
            add_measured_bytes(rows)
        except (RuntimeError, ValueError) as e:  # no counters permission, no kernel matched...
            first = str(e).strip().splitlines()
            print(f"ncu could not measure: {' | '.join(first[:3])}", file=sys.stderr)
            return 1
    print(format_table(rows), file=sys.stderr if a.csv == "-" else sys.stdout)
    if a.csv:
        write_csv(rows, a.csv)
    if a.png:
        from ckptlab.measure import plots

        plots.plot_bytes_vs_n(a.n, bytes_by_source(rows), path=a.png)
    return 0


def bytes_by_source(rows: list[dict]) -> dict:
    """{method: {source: bytes per N}} for plots.plot_bytes_vs_n (None where a source is absent)."""
    out: dict = {}
    for r in rows:
        by = out.setdefault(r["impl"], {})
        by.setdefault(r["hbm_source"], []).append(r["hbm_bytes"])
        if r["hbm_source"] != "modeled":
            by.setdefault("modeled", []).append(r["modeled_bytes"])
        if "measured_bytes" in r:
            by.setdefault("measured", []).append(r["measured_bytes"])
    return out


if __name__ == "__main__":
    sys.exit(main())
