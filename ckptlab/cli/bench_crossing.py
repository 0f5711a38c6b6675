"""When recompute stops paying: `python -m ckptlab bench crossing`

The recompute gain is stored time / flash time, forward + backward (> 1: recomputing P beats
reading it back). The two methods differ in one thing only, where P comes from:

    flash   recomputes S = Q K^T in its backward: 2 d more FLOPs per (i, j) pair (14 d, not 12 d)
    stored  writes S (fp32, 4 bytes, in both precisions) once in the forward and its dK/dV kernel
            reads it once: s = 8 more bytes per pair (crossing.per_pair counts them)

On the roofline (peak P FLOP/s, bandwidth W, ridge R = P / W) at large N, where the operands'
bytes are small next to these, flash is compute-bound and takes 14 d / P per pair. Stored's
time depends on whether its launches overlap:

    one launch after another (what the time model does: a sum of per-launch maxima)
        stored = max(4 d, 4 R) + max(8 d, 4 R)   (forward writes S, dK/dV reads it; x 1 / P)
        for R/2 < d < R that is 4 R + 8 d, and recompute pays while 4 R + 8 d > 14 d:
        d < 2 R / 3   (crossing.rule_of_thumb: A100 fp32, ridge 9.6: d < 6.4; A100 bf16,
                      ridge 153: d < 102; H200 bf16, ridge 206: d < 137)
    perfect overlap (one roofline over the whole forward + backward)
        stored = max(12 d, 8 R), and recompute pays while 8 R > 14 d:
        d < 4 R / 7   (rule_of_thumb(..., overlap=True): A100 bf16: d < 87)

The table prints the first, the rule the modeled gains obey, and the second beside it. A 16-bit
stored P instead of fp32 S (a what-if: no such kernel here) would move 2 + 2 bytes a pair, not
4 + 4: d < R / 3 (51 on an A100 in bf16), or 2 R / 7 with perfect overlap. The rule assumes
full waves and equal occupancy for both methods; the sweep does not.
Past it both are compute-bound and the gain is 12/14 = 0.86: the recompute is pure cost. The
sweep below checks the rule with the full time model (ckptlab.measure.timemodel: launch cost,
waves, bounds from unique and counted bytes) over head dims d, GPUs (ridges from ~10 FLOP/B in
fp32 to ~200 with tensor cores) and dtypes: fp32 times the fp32 kernels, bf16 the tensor-core
kernels (kernels/attn_flash_*_tc.cu: their launches, tiles, registers and shared memory, bytes
from traffic_tc, FLOPs at the tensor-core peak). With counted bytes (no cache) operands cost
~d/2 bytes a pair in fp32, which keeps flash memory-bound longer: the crossing moves up. On a
GPU, --measure times stored and flash (fp32) here and prints the measured gain beside the model.
"""

from __future__ import annotations

import argparse
import sys

from ckptlab import device, kernels
from ckptlab.cli.report import int_list, writable_file, write_csv
from ckptlab.measure import crossing, roofline, timemodel, whatif

DTYPES = ("fp32", "bf16", "fp16")  # what the sweep may ask for (16-bit: the tensor-core kernels;
# fp16 for a GPU without bf16 tensor cores, a T4)
DEFAULT_DTYPES = ("fp32", "bf16")
DEFAULT = dict(N=4096, B=1, H=16)  # enough blocks that every launch fills its waves
DEFAULT_DIMS = (16, 32, 64, 128, 256)  # any multiple of 8 up to 256 runs; each d costs a compile


def _where(d, ds) -> str:
    return f"none up to d = {max(ds)}" if d is None else f"first at d = {d}"


def r_(mine: dict, key: str) -> float:
    return next(iter(mine.values()))[key]


def _cell(r: dict | None) -> str:
    return "skipped" if r is None else f"{r['gain_unique']:.2f}-{r['gain_counted']:.2f}"


def format_table(rows: list[dict]) -> str:
    ds = sorted({r["d"] for r in rows})
    r0 = rows[0]
    head = (f"{'GPU':<16}{'dtype':<6}{'ridge':>7}" + "".join(f"{f'd={d}':>13}" for d in ds)
            + f"{'2R/3':>7}{'4R/7':>7}{'P16':>6}   gain < 1 (unique bytes / counted"
            + (" / P16 what-if, unique)" if "gain_p16_unique" in r0 else ")"))
    out = [f"recompute gain = stored / flash, modeled forward + backward time (N={r0['N']}, "
           f"B={r0['B']}, H={r0['H']}, {'causal' if r0['causal'] else 'non-causal'}); "
           "> 1: recomputing P is faster than reading it back; each cell: unique-counted bytes",
           head, "-" * len(head)]
    lo, hi = (crossing.crossings(rows, "gain_unique"),
              crossing.crossings(rows, "gain_counted"))
    p16 = crossing.crossings(rows, "gain_p16_unique") if "gain_p16_unique" in r0 else None
    for (gpu, dtype) in lo:
        mine = {r["d"]: r for r in rows if r["gpu"] == gpu and r["dtype"] == dtype}
        cells = "".join(f"{_cell(mine.get(d)):>13}" for d in ds)
        out.append(f"{gpu:<16}{dtype:<6}{r_(mine, 'ridge'):>7.1f}{cells}"
                   f"{r_(mine, 'rule_of_thumb_d'):>7.1f}{r_(mine, 'rule_overlap_d'):>7.1f}"
                   f"{r_(mine, 'rule_p16_d'):>6.0f}   {_where(lo[gpu, dtype], mine)} / "
                   f"{_where(hi[gpu, dtype], mine)}"
                   + ("" if p16 is None else f" / P16 {_where(p16[gpu, dtype], mine)}"))
    mid = 64 if 64 in ds else ds[len(ds) // 2]
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        at = [r for r in rows if r["d"] == mid and r["dtype"] == dtype]
        pays = [timemodel.short_name(r["gpu"]) for r in at if r["gain_unique"] > 1]
        costs = [timemodel.short_name(r["gpu"]) for r in at if r["gain_unique"] <= 1]
        out.append(f"at d = {mid}, {dtype} (unique bytes): recompute pays on "
                   f"{', '.join(pays) or 'none'}; it costs on {', '.join(costs) or 'none'}")
    s_bytes = timemodel.SCORE_BYTES * r0["B"] * r0["H"] * r0["N"] ** 2
    small = [timemodel.short_name(g) for g in dict.fromkeys(r["gpu"] for r in rows)
             if s_bytes <= roofline.spec(g)["l2_bytes"]]
    out.append(f"unique bytes bound DRAM traffic from below for a cold cache; back to back, S "
               f"({s_bytes / 2**20:.0f} MiB here) must exceed the L2 for that to hold: "
               + (f"it does not on {', '.join(small)}" if small else "it does on every GPU here")
               + " (timemodel.s_exceeds_l2_from)")
    kinds = {r["dtype"]: r["kernels"] for r in rows}
    out.append("ridge: peak FLOP/s / bandwidth (FLOP per byte); 2R/3: recompute pays while d < "
               "2 R / 3 with launches one after another, the model's form; 4R/7: with perfect "
               "overlap; P16: what-if, a 16-bit stored P instead of fp32 S (no such kernel "
               "runs; measure.whatif), d < R / 3 (crossing.rule_of_thumb); "
               + "; ".join(f"{k}: {v}" for k, v in kinds.items())
               + "; every time is modeled (ckptlab.measure.timemodel; registers and shared "
               f"memory: {timemodel.resources_note(rows[0]['gpu'])})")
    return "\n".join(out)


def skipped(gpus, dtypes, ds, **size) -> list[str]:
    """One line per (GPU, dtype) and reason for the head dims the sweep left out: the GPU's arch
    cannot run a kernel the model would time there (crossing.pair_refusal)."""
    lines = []
    for g in gpus:
        for dt in dtypes:
            why: dict = {}
            for d in ds:
                if reason := crossing.pair_refusal(g, dt, d, **size):
                    why.setdefault(reason, []).append(d)
            for reason, left in why.items():
                at = "" if left == list(ds) else f" d={','.join(map(str, left))}"
                lines.append(f"{g} {dt}{at}: skipped (not modeled), {reason}")
    return lines


def measure_gains(ds, *, N, B, H, causal=False, repeats=20) -> list[dict]:
    """On the GPU: stored and flash (fp32) timed here at each d (CUDA events, median and
    p10-p90 of repeats), the measured recompute gain, and the model's for this GPU beside it."""
    from ckptlab.cli import bench_attention

    gpu = roofline.current_gpu()
    rows = []
    for d in ds:
        t = {m: bench_attention.run_case(m, B, H, N, d, causal, repeats=repeats,
                                         gpus=(gpu,) if gpu else ())
             for m in ("stored", "flash")}
        row = dict(gpu=gpu or "this GPU", dtype="fp32", d=d, N=N, B=B, H=H, causal=causal,
                   gain_measured=t["stored"]["time_s"] / t["flash"]["time_s"],
                   source=t["flash"]["time_source"])
        for m in ("stored", "flash"):
            row.update({f"{m}_s": t[m]["time_s"], f"{m}_p10_s": t[m]["time_p10_s"],
                        f"{m}_p90_s": t[m]["time_p90_s"]})
        if gpu:
            g = timemodel.short_name(gpu)
            row.update(gain_unique=t["stored"][f"{g}_lo_s"] / t["flash"][f"{g}_lo_s"],
                       gain_counted=t["stored"][f"{g}_hi_s"] / t["flash"][f"{g}_hi_s"])
        rows.append(row)
    return rows


def format_measured(rows: list[dict]) -> str:
    out = [f"measured here ({rows[0]['source']}), fp32, N={rows[0]['N']}, B={rows[0]['B']}, "
           f"H={rows[0]['H']}: recompute gain = stored / flash median time"]
    for r in rows:
        model = (f"; modeled on {r['gpu']}: {r['gain_unique']:.2f}-{r['gain_counted']:.2f}"
                 if "gain_unique" in r else "")
        out.append(f"  d={r['d']:<4} stored {r['stored_s'] * 1e3:.3f} ms "
                   f"({r['stored_p10_s'] * 1e3:.3f}-{r['stored_p90_s'] * 1e3:.3f}), flash "
                   f"{r['flash_s'] * 1e3:.3f} ms ({r['flash_p10_s'] * 1e3:.3f}-"
                   f"{r['flash_p90_s'] * 1e3:.3f}): gain {r['gain_measured']:.2f}{model}")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ckptlab bench crossing", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d", type=int_list, default=list(DEFAULT_DIMS), help="head dims, "
                   f"multiples of 8 up to 256 (default {','.join(map(str, DEFAULT_DIMS))}); the "
                   "first run of each compiles its kernels (ptxas, ~1 s an instantiation)")
    p.add_argument("--n", type=int, default=DEFAULT["N"], help=f"N (default {DEFAULT['N']})")
    p.add_argument("--batch", type=int, default=DEFAULT["B"])
    p.add_argument("--heads", type=int, default=DEFAULT["H"])
    p.add_argument("--gpus", default=",".join(roofline.SPECS), help="comma-separated GPUs")
    p.add_argument("--dtype", default=",".join(DEFAULT_DTYPES),
                   help=f"from {DTYPES} (default {','.join(DEFAULT_DTYPES)})")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--measure", action="store_true", help="on a GPU: also time stored and flash "
                   "(fp32) here")
    p.add_argument("--csv", metavar="FILE", help="write the rows as CSV")
    a = p.parse_args(argv)
    bad = [d for d in a.d if d not in kernels.HEAD_DIMS]
    if bad:
        p.error(f"--d: expected head dims from {kernels.HEAD_DIMS}, got {bad}")
    dtypes = [x.strip() for x in a.dtype.split(",") if x.strip()]
    if not dtypes or any(x not in DTYPES for x in dtypes):
        p.error(f"--dtype: expected a comma-separated subset of {DTYPES}, got {a.dtype!r}")
    try:
        gpus = [roofline.spec(g)["name"] for g in a.gpus.split(",") if g.strip()]
    except ValueError as e:
        p.error(str(e))
    if not gpus:
        p.error(f"--gpus: expected comma-separated GPU names from {list(roofline.SPECS)}, got "
                f"{a.gpus!r}")
    if a.csv is not None:
        writable_file(a.csv)
    if min(a.n, a.batch, a.heads) < 1:
        p.error("--n, --batch and --heads must be >= 1")
    if a.measure and device.target() != "cuda":
        p.error("--measure needs the cuda target (a GPU)")
    rows = crossing.recompute_gains(gpus, dtypes, a.d, N=a.n, B=a.batch, H=a.heads,
                                     causal=a.causal)
    whatif.add_p16_gains(rows)
    if rows:
        print(format_table(rows))
    for line in skipped(gpus, dtypes, a.d, N=a.n, B=a.batch, H=a.heads, causal=a.causal):
        print(line)
    if a.measure:
        measured = measure_gains(a.d, N=a.n, B=a.batch, H=a.heads, causal=a.causal)
        print(format_measured(measured))
        rows += measured
    if a.csv is not None:
        write_csv(rows, a.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
