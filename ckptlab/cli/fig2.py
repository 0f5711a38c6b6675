"""The FlashAttention paper's Fig. 2 table, reproduced and corrected: `python -m ckptlab fig2`

Dao et al. 2022 (arXiv 2205.14135), Fig. 2 left: GPT-2 medium attention, N = 1024, d = 64,
H = 16 heads, batch B = 64, forward + backward on an A100, standard attention against
FlashAttention: GFLOPs, HBM reads + writes (GB) and runtime (ms). Here three methods, fp32:
standard (naive: unfused, S and P in HBM), stored (fused on the flash tiles, the scores S written
once in fp32 and read back, P = exp(S - L) formed from them) and flash (the same tiles, S
recomputed from Q and K, P from L); standard/stored is the fusion gain,
stored/flash the recompute gain (ckptlab.measure.timemodel.WHAT_DIFFERS).

    GFLOPs   matmul FLOPs at the full B, H: model (useful work, 12 d per (i, j) pair) and hardware
             (what runs: flash adds 2 d per pair to recompute S). The paper's 66.6 / 75.2 are one
             head's: N^2 B (12 d + 224) and N^2 B (14 d + 224), the factor H = 16 missing, with
             about 224 non-matmul FLOPs per score; the author gives about 825 / 963 GFLOPs
             (matmuls, all heads) in flash-attention issue #741 (PAPER_FLOPS_SOURCE).
    HBM GB   counted (every request, no cache: the upper bound; on the emulator counted on ONE
             head at the full N, times B * H, and checked against the model) and unique (the
             distinct bytes each launch touches: the lower bound), in fp32 and in fp16 (the
             paper's): stored and flash as their tensor-core kernels move them (traffic_tc:
             2-byte elements, fp32 L, D and stored's S), standard as a what-if (its fp32
             kernels at 2 bytes an element: it has no tensor-core kernel). Real DRAM traffic
             lies between the two bounds; the paper's 40.3 / 4.4 GB are DRAM bytes with caches,
             so they compare with unique fp16 bytes (at this size S is 4 GiB in fp32, far
             above an A100's 40 MiB L2: the unique bytes are a lower bound here). On a GPU
             with --ncu, Nsight Compute's measured bytes stand beside both.
    time     modeled on an A100 (ckptlab.measure.timemodel: launch cost + waves x roofline,
             bounds from unique and counted bytes) in fp32 and in fp16 (stored and flash: the
             tensor-core kernels; standard: the what-if); on a GPU also measured at the full
             size (CUDA events).
"""

from __future__ import annotations

import argparse
import sys

from tqdm import tqdm

from ckptlab import device, emu, kernels, measure
from ckptlab.cli import bench_attention
from ckptlab.cli.report import positive_int, writable_folder, write_csv
from ckptlab.measure import roofline, timemodel, traffic

B, H, N, D = 64, 16, 1024, 64
NN_ARGS = ("S", "P", "dP", "dS")  # the N x N arguments of the naive and stored kernels
METHODS = {"standard": "naive", "stored": "stored", "flash": "flash"}
# Fig. 2 (left) of arXiv 2205.14135, A100, fp16 (docs/references.md quotes it); "stored" is not
# in the paper.
PAPER = {"standard": dict(gflops=66.6, hbm_gb=40.3, ms=41.7),
         "flash": dict(gflops=75.2, hbm_gb=4.4, ms=7.3)}
PAPER_CORRECTED_GFLOPS = {"standard": 825.0, "flash": 963.0}
NON_MATMUL_PER_SCORE = 224  # FLOPs per (i, j) pair the published figures add to the matmuls
PAPER_FLOPS_SOURCE = ("https://github.com/Dao-AILab/flash-attention/issues/741 (T. Dao: "
                      "'the left column FLOPs should be 825 GFLOPs and the right column should "
                      "be 963 GFLOPs')")
SPEC = "A100-SXM4-80GB"


def published_gflops(method: str) -> float:
    """What the paper's GFLOPs figure computes: N^2 B (12 d + 224) for standard attention,
    N^2 B (14 d + 224) for flash (its recompute), i.e. one head's FLOPs (no factor H)."""
    per_pair = (14 if method == "flash" else 12) * D + NON_MATMUL_PER_SCORE
    return N * N * B * per_pair / 1e9


def count_one_head(impl: str, n: int | None = None, d: int = D) -> dict:
    """Run forward + backward of one head (B = H = 1, N = n, default N) on the emulator, counted;
    returns the total global bytes, the part that went to the N x N arguments, and the seconds."""
    n = N if n is None else n
    q, k, v, dO = kernels.random_inputs(1, 1, n, d)
    with device.use("emu"), emu.settings(mode="counted", race_check=False), emu.record() as rec:
        bench_attention.forward_backward(impl, q, k, v, dO)
    per_arg = [(name, a) for x in rec.launches for name, a in x.args.items()]
    total = sum(a.read_bytes + a.write_bytes + a.atomic_bytes for _, a in per_arg)
    nn = sum(a.read_bytes + a.write_bytes for name, a in per_arg if name in NN_ARGS)
    return dict(bytes=total, nn_bytes=nn, seconds=rec.seconds)


def model_bytes(impl: str, b: int, h: int) -> dict:
    """The model's counted and unique bytes (traffic.launches) in fp32, and unique bytes in fp16
    of the launches timemodel times at fp16 (stored, flash: the tensor-core kernels; naive: the
    what-if at 2 bytes an element, L, D and atomics fp32: timemodel.launch_bytes)."""
    runs = traffic.launches(impl, b, h, N, N, D)
    t = traffic.totals(runs)
    fp16, _ = timemodel.timed_launches(impl, b, h, N, N, D, dtype="fp16")
    return dict(counted=t["bytes"], unique=t["unique_bytes"],
                unique_fp16=sum(timemodel.launch_bytes(kt, "fp16")["unique"] for kt in fp16))


def run(progress: bool = True, repeats: int = 20, count: bool = True) -> list[dict]:
    """One row per method, with the paper's numbers alongside where it has them. On the emulator
    `count` runs one head at the full N to count its bytes (~5 s a method); count=False takes
    the model's counted bytes instead (proven equal to the count in tests), and says so."""
    target = device.target()
    rows = []
    for name, impl in tqdm(METHODS.items(), desc=f"fig2 ({target})", disable=not progress,
                           file=sys.stderr, leave=False):
        model = traffic.totals(traffic.launches(impl, B, H, N, N, D))
        full, one = model_bytes(impl, B, H), model_bytes(impl, 1, 1)
        if full["counted"] != B * H * one["counted"]:
            raise AssertionError(f"{impl}: modeled bytes are not B*H times one head's")
        row = dict(method=name, impl=impl, B=B, H=H, N=N, d=D, target=target,
                   model_gflops=(traffic.model_flops(B, H, N, N, D)
                                 + traffic.model_flops(B, H, N, N, D, backward=True)) / 1e9,
                   hardware_gflops=model["flops"] / 1e9,
                   counted_gb=full["counted"] / 1e9, unique_gb=full["unique"] / 1e9,
                   unique_fp16_gb=full["unique_fp16"] / 1e9)
        if target == "emu" and not count:
            row["counted_source"] = "modeled (the emulator counts the same: tests)"
        elif target == "emu":
            c = count_one_head(impl)
            if c["bytes"] != one["counted"]:
                raise AssertionError(f"{impl}: counted {c['bytes']} != modeled {one['counted']}")
            row.update(counted_gb=B * H * c["bytes"] / 1e9, nn_gb=B * H * c["nn_bytes"] / 1e9,
                       counted_source=f"counted on 1 head at N={N}, x B*H={B * H}")
        else:
            r = bench_attention.run_case(impl, B, H, N, D, repeats=repeats)
            row.update(counted_source="modeled (ckptlab.measure.traffic)",
                       time_ms=r["time_s"] * 1e3, time_p10_ms=r["time_p10_s"] * 1e3,
                       time_p90_ms=r["time_p90_s"] * 1e3, time_source=r["time_source"])
        for dtype in ("fp32", "fp16"):
            t = timemodel.method_time(impl, B, H, N, N, D, SPEC, dtype=dtype)
            row.update({f"modeled_{dtype}_lo_ms": t.lower * 1e3,
                        f"modeled_{dtype}_hi_ms": t.upper * 1e3,
                        f"modeled_{dtype}_kernels": t.kernels})
        row.update({f"paper_{k}": v for k, v in PAPER.get(name, {}).items()})
        rows.append(row)
    return rows


def add_measured(rows: list[dict]) -> None:
    """DRAM bytes measured by Nsight Compute at the full size (GPU with ncu only)."""
    for r in rows:
        case = dict(target="cuda", impl=r["impl"], B=B, H=H, N=N, d=D, causal=False)
        bench_attention.add_measured_bytes([case])
        r["measured_gb"] = case["measured_bytes"] / 1e9


def paper_roofline() -> dict:
    """The paper's own numbers on the A100 fp16 roofline, with the corrected FLOPs: modeled
    time per column (and its bound) and the modeled speed-up, against the measured 5.7x."""
    out = {}
    for name in PAPER:
        t = roofline.modeled_time(PAPER_CORRECTED_GFLOPS[name] * 1e9, PAPER[name]["hbm_gb"] * 1e9,
                                  SPEC, "fp16")
        out[name] = (t.seconds * 1e3, t.bound)
    out["speedup"] = out["standard"][0] / out["flash"][0]
    return out


W, GW = 13, 13  # widths of a method's column and of a gain's


def _gains(values: list[float]) -> str:
    g = timemodel.decomposition(dict(zip(timemodel.CHAIN, values, strict=True)))
    return "".join(f"{g[k]:>{GW - 1}.2f}x" for k in ("fusion", "recompute", "product"))


def format_table(rows: list[dict]) -> str:
    by = {r["method"]: r for r in rows}
    cols = list(METHODS)
    lines = [f"FlashAttention Fig. 2: N={N}, d={D}, H={H}, B={B}, forward + backward (this lab: "
             f"fp32 kernels on target {rows[0]['target']!r}; paper: fp16 on an A100)",
             f"{'':<40}" + "".join(f"{c:>{W}}" for c in cols)
             + f"{'fusion':>{GW}}{'recompute':>{GW}}{'product':>{GW}}   {'paper std':>10}"
             f"{'paper flash':>12}"]

    def line(label, key, paper=None, fmt="{:.1f}", gains=True):
        vals = [by[c][key] for c in cols]
        text = f"{label:<40}" + "".join(f"{fmt.format(v):>{W}}" for v in vals)
        text += _gains(vals) if gains else " " * 3 * GW
        if paper:
            text += f"   {paper[0]:>10}{paper[1]:>12}"
        return text

    def span(label, lo, hi):
        a, b = [by[c][lo] for c in cols], [by[c][hi] for c in cols]
        text = f"{label:<40}" + "".join(f"{f'{x:.3g}-{y:.3g}':>{W}}"
                                        for x, y in zip(a, b, strict=True))
        ga, gb = (timemodel.decomposition(dict(zip(timemodel.CHAIN, v, strict=True)))
                  for v in (a, b))
        return text + "".join(f"{f'{ga[k]:.2f}-{gb[k]:.2f}x':>{GW}}"
                              for k in ("fusion", "recompute", "product"))

    pub = tuple(f"{PAPER[c]['gflops']}->{PAPER_CORRECTED_GFLOPS[c]:.0f}" for c in PAPER)
    lines.append(line("GFLOPs, model (useful, matmuls)", "model_gflops"))
    lines.append(line("GFLOPs, hardware (with recompute)", "hardware_gflops", pub))
    lines.append(line("HBM GB, counted fp32 (no cache: upper)", "counted_gb"))
    if "nn_gb" in by["standard"]:
        lines.append(line("  of which N x N (S, P, dP, dS)", "nn_gb", gains=False))
    lines.append(line("HBM GB, unique fp32 (ideal cache: lower)", "unique_gb"))
    lines.append(line("HBM GB, unique fp16 (std: what-if)", "unique_fp16_gb",
                      tuple(PAPER[c]["hbm_gb"] for c in PAPER)))
    if "measured_gb" in by["standard"]:
        lines.append(line("HBM GB, measured fp32 (ncu)", "measured_gb"))
    lines.append(span("ms, modeled A100 fp32 (lower-upper)", "modeled_fp32_lo_ms",
                      "modeled_fp32_hi_ms"))
    lines.append(span("ms, modeled A100 fp16 (std: what-if)", "modeled_fp16_lo_ms",
                      "modeled_fp16_hi_ms")
                 + f"   {PAPER['standard']['ms']:>10}{PAPER['flash']['ms']:>12}  (measured)")
    if "time_ms" in by["standard"]:
        lines.append(line("ms, measured here (fp32)", "time_ms", fmt="{:.2f}"))
    p = paper_roofline()
    lines += [
        "gains: cost of the first method / cost of the second (> 1: the second is cheaper); "
        "fusion = standard/stored, recompute = stored/flash, product = standard/flash",
        f"paper GFLOPs: 66.6 and 75.2 = N^2 B (12 d + {NON_MATMUL_PER_SCORE}) and N^2 B (14 d + "
        f"{NON_MATMUL_PER_SCORE}) = {published_gflops('standard'):.1f} and "
        f"{published_gflops('flash'):.1f}: one head's FLOPs (the factor H = {H} is missing) "
        f"with ~{NON_MATMUL_PER_SCORE} non-matmul FLOPs per score; the author's correction, "
        f"matmuls over all heads: ~825 and ~963 ({PAPER_FLOPS_SOURCE})",
        "bytes: real DRAM traffic lies between unique (each launch's distinct bytes: an ideal "
        "cache) and counted (every request: no cache); the paper's 40.3 / 4.4 GB are DRAM bytes "
        "of fp16 kernels, so compare them with unique fp16, not with counted requests; "
        f"counted: {by['standard']['counted_source']}",
        f"the paper's own numbers on the A100 fp16 roofline (825 / 963 GFLOPs, 40.3 / 4.4 GB): "
        f"standard {p['standard'][0]:.2f} ms ({p['standard'][1]}-bound), flash "
        f"{p['flash'][0]:.2f} ms ({p['flash'][1]}-bound): {p['speedup']:.1f}x modeled, "
        f"{PAPER['standard']['ms'] / PAPER['flash']['ms']:.1f}x measured",
        "times modeled: launch cost + waves x roofline (ckptlab.measure.timemodel), lower from "
        "unique bytes, upper from counted; fp16: stored and flash are "
        f"{by['flash']['modeled_fp16_kernels']} (stored keeps S in fp32), standard is a "
        f"{by['standard']['modeled_fp16_kernels']}, so the fp16 fusion gain compares a what-if "
        f"with a kernel; registers and shared memory: {timemodel.resources_note(SPEC)}",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ckptlab fig2", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="ckptlab-results", help="folder for fig2.csv")
    p.add_argument("--repeats", type=positive_int, default=20, help="timed repeats on a GPU")
    p.add_argument("--ncu", action="store_true", help="add Nsight Compute's measured bytes")
    a = p.parse_args(argv)
    out = writable_folder(a.out)  # before the ~12 s of work
    if a.ncu and not (device.target() == "cuda" and measure.ncu_available()):
        p.error("--ncu needs the cuda target and `ncu` (Nsight Compute) on the PATH")
    rows = run(repeats=a.repeats)
    if a.ncu:
        add_measured(rows)
    print(format_table(rows))
    write_csv(rows, out / "fig2.csv")
    print(f"wrote {out / 'fig2.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
