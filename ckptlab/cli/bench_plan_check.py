"""The step model against published training runs: `python -m ckptlab bench plan-check`

For each run of ckptlab.cluster.published_runs (Narayanan et al. 2021, Table 1: ten GPT models
from 1.7B to 1T; Korthikanti et al. 2022, Tables 3 and 5: 22B to 1T; llm-foundry's PyTorch FSDP
runs of MPT 1B-70B, ckptlab.cluster.fsdp_runs), on the run's own GPUs (A100 80GB or 40GB) and
batch:
  fits       does the published layout fit the GPU's memory by ckptlab.cluster.step_memory?
  modeled    its TFLOP/s per GPU by ckptlab.cluster.step_time, in the paper's own FLOP count,
             against the published one. The efficiency curve (ckptlab.cluster.efficiency:
             E_MAX h / (h + X_HALF) of the peak) is fitted on the rows named in
             published_runs.CALIBRATION only; the error is reported on every row, the
             calibration rows marked, the held-out ones summarised (median and max |error|:
             the model's demonstrated error, plan_compare.MODEL_ERROR).
  planner    the plan ckptlab.cluster.planner chooses on the same GPUs and batch: its layout,
             its modeled time against the published layout's, and the term that differs most;
             then the planner limited to what the run's software had (published_runs.SOFTWARE:
             no FlashAttention, no ZeRO; Narayanan's runs without sequence parallelism or
             selective recompute; llm-foundry's FSDP and FlashAttention at its micro-batch),
             which separates the layout from the newer methods.
Checks: every published layout fits; the planner never slower, by the model, than the
published layout (it is one of the layouts the planner tries, so this holds by construction:
the check is that it does), with all its options or only the run's own. The held-out errors
are reported, never a target.
--fit refits the curve on the calibration rows and prints E_MAX and X_HALF (what
ckptlab.cluster.efficiency must hold).
Then the Llama-family runs (ckptlab.cli.bench_plan_check_llama: torchtitan's Llama 3 8B, 70B
and 405B), every one held out, in torchtitan's own FLOP count.
"""

from __future__ import annotations

import argparse
import math
import sys

from ckptlab.cli import bench_plan_check_llama
from ckptlab.cli.report import UsageError, writable_file, write_csv
from ckptlab.cluster import efficiency, fsdp_runs, plan_compare, planner, published_runs, step_time
from ckptlab.cluster import step_memory as sm

RECIPE = "bf16"  # published_runs' shared assumption: 16 bytes a parameter
OVERLAP_DP = published_runs.OVERLAP_DP


def overlap_of(r: published_runs.Run) -> bool:
    """Megatron-LM of 2021-22 reduced the gradients after the backward (OVERLAP_DP); PyTorch
    FSDP overlaps its gathers and reduce-scatters with compute by design."""
    return True if r.software_of == "composer" else OVERLAP_DP
GRID = [0.0] + [25.0 * 2 ** (k / 8) for k in range(81)]  # X_HALF tried by the fit, 25..25600


def model_of(r: published_runs.Run) -> sm.GPTShape:
    vocab = fsdp_runs.VOCAB if r.software_of == "composer" else published_runs.VOCAB
    return sm.GPTShape(r.layers, r.hidden, r.heads, published_runs.SEQ, vocab)


def memory_of(r: published_runs.Run) -> int:
    return r.memory_gib * 2**30  # nvidia-smi reports 81920 MiB on an A100 80GB


def counted_flops(r: published_runs.Run) -> float:
    """A step's FLOPs in the paper's own count (Narayanan's Eq. 3 or the model FLOPs)."""
    model = model_of(r)
    if r.flops_count == "narayanan":
        return step_time.narayanan_flops(model, r.batch)
    return step_time.model_flops(model, r.batch)


def published_option(r: published_runs.Run, achievable=None):
    """The published layout as the model sees it: (Option or None, what was not published and
    was chosen). Recompute as published; micro-batch and virtual stages the published ones, or
    the fastest the model finds for this t, p and d."""
    model = model_of(r)
    if r.base is not None:
        base, full = r.base, (None if r.recompute == "full" else 0)
    else:
        base, full = ("none", None) if r.recompute == "full" else (r.recompute, 0)
    sizes = [r.micro_batch] if r.micro_batch else [b for b in (1, 2, 4, 8, 16)
                                                   if (r.batch // r.d) % b == 0]
    best = None
    for b in sizes:
        m = r.batch // (r.d * b)
        vs = [r.v] if r.v else [v for v in range(1, planner.MAX_VIRTUAL + 1 if r.p > 1 else 2)
                                if (r.layers // r.p) % v == 0 and (v == 1 or m % r.p == 0)]
        for v in vs:
            layout = sm.Layout(r.d, r.t, r.sp, r.zero, b, r.p, v)
            k = r.layers // (r.p * v) if full is None else full
            opt = planner.evaluate(model, layout, m, r.gpu, memory_of(r), RECIPE, r.loss, base,
                                   k, r.dropout, achievable=achievable,
                                   overlap_dp=overlap_of(r))
            if opt is not None and (best is None or opt.step_s < best.step_s):
                best = opt
    chosen = [] if r.micro_batch else ["micro-batch"]
    if not r.v:
        chosen.append("virtual stages")
    return best, chosen


def modeled_tflops(r, opt) -> float:
    return counted_flops(r) / opt.step_s / r.gpus / 1e12


def _log_ratios(runs, constants) -> list[float]:
    out = []
    for r in runs:
        opt, _ = published_option(r, constants)
        if opt is None:
            raise ValueError(f"{r.name}: the published layout does not fit; cannot fit on it")
        out.append(math.log(modeled_tflops(r, opt) / r.tflops))
    return out


def _e_max(runs, x_half: float) -> float:
    """The E_MAX at which the rows' modeled throughputs have a geometric-mean ratio of 1 to the
    published ones, at this X_HALF (bisection: the ratio grows with E_MAX)."""
    lo, hi = 0.05, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(_log_ratios(runs, (mid, x_half))) < 0 else (lo, mid)
    return (lo + hi) / 2


def fit(names=published_runs.CALIBRATION) -> tuple[float, float]:
    """(E_MAX, X_HALF) of ckptlab.cluster.efficiency fitted on the named rows only: for each
    X_HALF of GRID the E_MAX that centres them (geometric mean 1), then the pair with the least
    squared log errors; rounded to 3 decimals and a whole X_HALF. Reads no other row."""
    runs = [published_runs.run(n) for n in names]
    best = None
    for x_half in GRID:
        e_max = _e_max(runs, x_half)
        if e_max >= 1.0 - 1e-9:
            continue
        spread = sum(x * x for x in _log_ratios(runs, (e_max, x_half)))
        if best is None or spread < best[0]:
            best = (spread, e_max, x_half)
    if best is None:
        raise ValueError("fit: no X_HALF of GRID reaches the calibration rows below E_MAX = 1")
    x_half = float(round(best[2]))
    return round(_e_max(runs, x_half), 3), x_half


def rows(achievable=None, names=None) -> list[dict]:
    out = []
    for r in published_runs.RUNS:
        if names and r.name not in names:
            continue
        opt, chosen = published_option(r, achievable)
        model = model_of(r)
        kw = dict(recipe=RECIPE, loss=r.loss, dropout=r.dropout, achievable=achievable,
                  overlap_dp=overlap_of(r))
        plan, _ = planner.plan(model, r.gpus, r.gpu, memory_of(r), r.batch, **kw)
        row = dict(run=r.name, source=r.source, gpu=r.gpu, t=r.t, p=r.p, d=r.d, gpus=r.gpus,
                   zero=r.zero, batch=r.batch, recompute=r.recompute,
                   published_tflops=r.tflops,
                   calibration=r.name in published_runs.CALIBRATION,
                   fits=opt is not None, chosen_by_model=", ".join(chosen))
        if opt is not None:
            tf = modeled_tflops(r, opt)
            row.update(micro_batch=opt.layout.micro_batch, v=opt.layout.vp,
                       peak_gib=opt.peak / 2**30, step_s=opt.step_s, modeled_tflops=tf,
                       error=tf / r.tflops - 1)
        # llm-foundry's micro-batches (6, 10, 14...) are its own search's, outside the powers of
        # two the planner tries: its software is held to the published one
        mb = r.micro_batch if r.software_of == "composer" else None
        own, _ = planner.plan(model, r.gpus, r.gpu, memory_of(r), r.batch, mb, **kw,
                              **published_runs.software(r))
        # the planner tries powers of two up to MAX_MICRO_BATCH: a published micro-batch
        # outside them is a layout it never saw, so "never slower" does not apply there
        row["outside"] = r.micro_batch is not None and (
            r.micro_batch & (r.micro_batch - 1) or r.micro_batch > planner.MAX_MICRO_BATCH)
        for key, chosen in (("plan", plan), ("own", own)):
            if chosen is None:
                continue
            seen = key == "own" or not row["outside"]
            row.update({f"{key}_layout": layout_text(chosen.layout),
                        f"{key}_recompute": chosen.recompute_short(r.layers),
                        f"{key}_step_s": chosen.step_s, f"{key}_not_slower":
                        opt is None or not seen or chosen.step_s <= opt.step_s * (1 + 1e-12)})
            if opt is not None:
                why = ("published loses on " + plan_compare.why_faster(chosen, opt)
                       if opt.step_s > chosen.step_s else "the same"
                       if opt.step_s == chosen.step_s or seen
                       else f"published micro-batch {r.micro_batch} is not one the planner tries")
                row.update({f"{key}_gain": opt.step_s / chosen.step_s - 1, f"{key}_why": why,
                            f"{key}_same_tp": (chosen.layout.tp, chosen.layout.pp) ==
                            (r.t, r.p)})
        out.append(row)
    return out


def held_out_error(table: list[dict]) -> tuple[float, float]:
    """(median, max) absolute error of the held-out rows that fit: the model's demonstrated
    error."""
    errs = sorted(abs(r["error"]) for r in table if not r["calibration"] and r["fits"])
    if not errs:
        return float("nan"), float("nan")
    mid = len(errs) // 2
    median = errs[mid] if len(errs) % 2 else (errs[mid - 1] + errs[mid]) / 2
    return median, errs[-1]


def layout_text(lay: sm.Layout) -> str:
    v = f" v={lay.vp}" if lay.vp > 1 else ""
    return (f"t={lay.tp}{'+SP' if lay.sp else ''} p={lay.pp}{v} d={lay.dp} "
            f"ZeRO-{lay.zero} b={lay.micro_batch}")


def _gpu(name: str) -> str:
    return {"A100-SXM4-80GB": "A100-80", "A100-SXM4-40GB": "A100-40"}.get(name, name)


def format_table(table: list[dict]) -> str:
    e_max, x_half = efficiency.E_MAX, efficiency.X_HALF
    out = [f"Published runs against the step model (recipe {RECIPE}; compute at "
           f"{e_max:g} x / (x + {x_half:g}) of the peak, x = h, fitted on "
           f"{', '.join(published_runs.CALIBRATION)}; links at their measured rates)", "",
           f"{'run':<15}{'gpu':<8}{'t':>2}{'p':>3}{'d':>5}{'Z':>2}{'batch':>6} {'fits':<5}"
           f"{'b':>3}{'v':>3}{'peak GiB':>9}{'publ. TF':>9}{'model TF':>9}{'error':>8}  "
           f"{'planner: layout, recompute':<44}{'step s':>8}{'vs publ.':>9}  why"]
    for r in table:
        cal = "*" if r["calibration"] else " "
        line = f"{r['run'] + cal:<15}{_gpu(r['gpu']):<8}{r['t']:>2}{r['p']:>3}{r['d']:>5}" \
               f"{r['zero']:>2}{r['batch']:>6} {'yes' if r['fits'] else 'NO':<5}"
        if r["fits"]:
            line += (f"{r['micro_batch']:>3}{r['v']:>3}{r['peak_gib']:>9.1f}"
                     f"{r['published_tflops']:>9.1f}{r['modeled_tflops']:>9.1f}"
                     f"{r['error']:>+8.1%}")
        else:
            line += f"{'':>32}"
        if "plan_layout" in r:
            plan = f"{r['plan_layout']}, {r['plan_recompute']}"
            line += f"  {plan:<44}{r['plan_step_s']:>8.2f}"
            if "plan_gain" in r:
                line += f"{-r['plan_gain'] / (1 + r['plan_gain']):>+9.1%}  {r['plan_why']}"
        out.append(line)
    out += ["", "The planner limited to each run's own software (no FlashAttention, no ZeRO; "
            "Narayanan 2021 without sequence parallelism or selective recompute; llm-foundry: "
            "FSDP and FlashAttention only)", "",
            f"{'run':<15}{'published t, p':>15}  {'planner: layout, recompute':<44}"
            f"{'step s':>8}{'vs publ.':>9}  why"]
    for r in table:
        if "own_layout" not in r:
            out.append(f"{r['run']:<15}{r['t']:>8}, {r['p']:<5}  nothing fits")
            continue
        own = f"{r['own_layout']}, {r['own_recompute']}"
        line = f"{r['run']:<15}{r['t']:>8}, {r['p']:<5}  {own:<44}{r['own_step_s']:>8.2f}"
        if "own_gain" in r:
            line += f"{-r['own_gain'] / (1 + r['own_gain']):>+9.1%}  {r['own_why']}"
        out.append(line)
    held = [r for r in table if not r["calibration"] and r["fits"]]
    cal = [r for r in table if r["calibration"] and r["fits"]]
    median, worst = held_out_error(table)
    fit_all = all(r["fits"] for r in table)
    slower = [r["run"] for r in table if not r.get("plan_not_slower", True)]
    own_slower = [r["run"] for r in table if not r.get("own_not_slower", True)]
    same = sum(bool(r.get("own_same_tp")) for r in table)
    outside = [r["run"] for r in table if r.get("outside")]
    zero3 = [r for r in held if r["zero"] == 3]
    out += ["", "* a calibration row (the curve is fitted on it); every other row is held out "
            "and only reported", "Z: ZeRO stage (3: PyTorch FSDP FULL_SHARD)",
            "b, v: micro-batch and virtual stages; not in Narayanan's Table 1, so the fastest the "
            "model finds for the published t, p, d (published in Korthikanti's Table 3 and "
            "llm-foundry's tables)",
            "TF: teraFLOP/s per GPU in the paper's own count (Narayanan: Eq. 3 with full "
            "recompute; Korthikanti: model FLOPs, MFU x 312; llm-foundry: its tokens/s at "
            "Korthikanti's model FLOPs a token); vs publ.: the plan's step time against the "
            "published layout's, both modeled; why: the term that differs most", "",
            f"calibration rows: {len(cal)}, mean |error| "
            f"{sum(abs(r['error']) for r in cal) / max(1, len(cal)):.1%}; held-out rows: "
            f"{len(held)}, median |error| {median:.1%}, max {worst:.1%}"
            + (f"; of them ZeRO-3 / FSDP: {len(zero3)}, median |error| "
               f"{held_out_error([dict(r, calibration=False) for r in zero3])[0]:.1%}"
               if zero3 else ""),
            f"every published layout fits: {'met' if fit_all else 'NOT met'}; planner never "
            f"slower: {'met' if not slower else 'NOT met: ' + str(slower)}"
            + (f" (not compared on {len(outside)} runs whose published micro-batch is not a "
               "power of two up to 16, which the planner does not try: "
               f"{', '.join(outside)})" if outside else "")
            + "; limited to the run's software: "
            + ("met" if not own_slower else "NOT met: " + str(own_slower))
            + f" (the published t and p chosen on {same} of {len(table)})",
            "sources:"] + [f"  {r['run']}: {r['source']}" for r in table]
    return "\n".join(out)


def csv_rows(table: list[dict], llama: list[dict]) -> list[dict]:
    """Both sections' rows for one CSV, each marked with its section (gpt or llama)."""
    return [dict(section="gpt", **r) for r in table] + \
        [dict(section="llama", **r) for r in llama]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ckptlab bench plan-check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fit", action="store_true",
                   help="refit the efficiency curve on the calibration rows and print it")
    p.add_argument("--csv", metavar="FILE", help="write the rows as CSV, the Llama section's "
                   "included (a column `section`: gpt or llama; '-': stdout, and the tables go "
                   "to stderr)")
    a = p.parse_args(argv)
    if a.csv is not None:
        writable_file(a.csv)
    if a.fit:
        e_max, x_half = fit()
        print(f"efficiency curve fitted on {', '.join(published_runs.CALIBRATION)}: "
              f"E_MAX = {e_max:g}, X_HALF = {x_half:g} (ckptlab.cluster.efficiency holds "
              f"E_MAX = {efficiency.E_MAX:g}, X_HALF = {efficiency.X_HALF:g})")
        return 0
    table, llama = rows(), bench_plan_check_llama.rows()
    out = sys.stderr if a.csv == "-" else sys.stdout  # `--csv - > rows.csv` is a CSV
    print(format_table(table), file=out)
    print(file=out)
    print(bench_plan_check_llama.format_table(llama), file=out)
    if a.csv is not None:
        try:
            write_csv(csv_rows(table, llama), a.csv)
        except OSError as e:
            raise UsageError(f"--csv {a.csv}: cannot write it ({e.strerror or e})") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
