"""The FlashAttention paper's Fig. 2 table, reproduced: `python -m ckptlab fig2`

Dao et al. 2022 (arXiv 2205.14135), Fig. 2 left: GPT-2 medium attention, N = 1024, d = 64,
H = 16 heads, batch B = 64, forward + backward on an A100, standard attention against
FlashAttention: GFLOPs, HBM reads + writes (GB) and runtime (ms). Here "standard" is the store-P
kernels (kernels/attn_naive_*.cu) and "flash" the recompute-P ones, both in fp32.

    GFLOPs   model (useful work, 12 d per (i, j) pair) and hardware (what runs: flash adds the
             recompute of S in its backward), from ckptlab.measure.traffic, at the full B, H
    HBM GB   emulator: counted on ONE head (B = H = 1) at the full N = 1024, times B * H (every
             head does the same work; the formula of ckptlab.measure.traffic is checked to equal
             both the count and B * H times itself). GPU: the formula ("modeled"), and with
             --ncu the DRAM bytes Nsight Compute measured.
    time     GPU: measured at the full size (CUDA events). Emulator: modeled on an A100,
             max(FLOPs / peak, bytes / bandwidth), at fp32 (what these kernels run), and a what-if
             at the paper's precision: fp16 tensor-core peak with half the bytes.

The paper ran fp16 kernels whose tiles stay in L2 and shared memory; the emulator models no cache
(an operand tile read twice counts twice), so bytes are compared in kind, not to the digit.
"""

from __future__ import annotations

import argparse
import sys

from tqdm import tqdm

from ckptlab import device, emu, kernels, measure
from ckptlab.cli import bench_attention
from ckptlab.cli.report import positive_int, writable_folder, write_csv
from ckptlab.measure import roofline, traffic

B, H, N, D = 64, 16, 1024, 64
NN_ARGS = ("S", "P", "dP", "dS")  # the N x N arguments of the naive kernels
METHODS = {"standard": "naive", "flash": "flash"}
# Fig. 2 (left) of arXiv 2205.14135, A100, fp16 (docs/references.md quotes it).
PAPER = {"standard": dict(gflops=66.6, hbm_gb=40.3, ms=41.7),
         "flash": dict(gflops=75.2, hbm_gb=4.4, ms=7.3)}


def count_one_head(impl: str, n: int | None = None, d: int = D) -> dict:
    """Run forward + backward of one head (B = H = 1, N = n, default N) on the emulator, counted;
    returns the total global bytes and the part that went to the N x N arguments (S, P, dP, dS)."""
    n = N if n is None else n
    q, k, v, dO = kernels.random_inputs(1, 1, n, d)
    with device.use("emu"), emu.settings(mode="counted", race_check=False), emu.record() as rec:
        bench_attention.forward_backward(impl, q, k, v, dO)
    per_arg = [(name, a) for x in rec.launches for name, a in x.args.items()]
    total = sum(a.read_bytes + a.write_bytes + a.atomic_bytes for _, a in per_arg)
    nn = sum(a.read_bytes + a.write_bytes for name, a in per_arg if name in NN_ARGS)
    return dict(bytes=total, nn_bytes=nn, seconds=rec.seconds)


def run(progress: bool = True, repeats: int = 20) -> list[dict]:
    """One row per method, with the paper's numbers alongside."""
    target = device.target()
    rows = []
    for name, impl in tqdm(METHODS.items(), desc=f"fig2 ({target})", disable=not progress,
                           file=sys.stderr, leave=False):
        launches = traffic.launches(impl, B, H, N, N, D)
        model = traffic.totals(launches)
        one = traffic.totals(traffic.launches(impl, 1, 1, N, N, D))
        if model["bytes"] != B * H * one["bytes"]:
            raise AssertionError(f"{impl}: modeled bytes are not B*H times one head's")
        row = dict(method=name, impl=impl, B=B, H=H, N=N, d=D, target=target,
                   model_gflops=(traffic.model_flops(B, H, N, N, D)
                                 + traffic.model_flops(B, H, N, N, D, backward=True)) / 1e9,
                   hardware_gflops=model["flops"] / 1e9)
        if target == "emu":
            c = count_one_head(impl)
            if c["bytes"] != one["bytes"]:
                raise AssertionError(f"{impl}: counted {c['bytes']} != modeled {one['bytes']}")
            row.update(hbm_gb=B * H * c["bytes"] / 1e9, nn_gb=B * H * c["nn_bytes"] / 1e9,
                       hbm_source=f"counted on 1 head at N={N}, x B*H={B * H}")
            spec = roofline.spec("a100")["name"]
            t = roofline.modeled_time(model["flops"], row["hbm_gb"] * 1e9, spec, "fp32")
            t16 = roofline.modeled_time(model["flops"], row["hbm_gb"] * 1e9 / 2, spec, "fp16")
            row.update(time_ms=t.seconds * 1e3, time_source=f"modeled ({spec}, fp32)",
                       bound=t.bound, fp16_whatif_ms=t16.seconds * 1e3, fp16_bound=t16.bound)
        else:
            r = bench_attention.run_case(impl, B, H, N, D, repeats=repeats)
            row.update(hbm_gb=model["bytes"] / 1e9, hbm_source="modeled (ckptlab.measure.traffic)",
                       time_ms=r["time_s"] * 1e3, time_source=r["time_source"],
                       modeled_ms=r["modeled_s"] * 1e3, bound=r["modeled_bound"],
                       modeled_device=r["modeled_device"],
                       alloc_peak_gb=r["alloc_peak_bytes"] / 1e9)
        row.update({f"paper_{k}": v for k, v in PAPER[name].items()})
        rows.append(row)
    return rows


def add_measured(rows: list[dict]) -> None:
    """DRAM bytes measured by Nsight Compute at the full size (GPU with ncu only)."""
    for r in rows:
        case = dict(target="cuda", impl=r["impl"], B=B, H=H, N=N, d=D, causal=False)
        bench_attention.add_measured_bytes([case])
        r["measured_gb"] = case["measured_bytes"] / 1e9


def format_table(rows: list[dict]) -> str:
    s, f = rows[0], rows[1]
    lines = [f"FlashAttention Fig. 2: N={N}, d={D}, H={H}, B={B}, forward + backward "
             f"(this lab: fp32 kernels on target {s['target']!r}; paper: fp16 on an A100)",
             f"{'':<34}{'standard':>12}{'flash':>12}{'flash/std':>11}   {'paper std':>10}"
             f"{'paper flash':>12}{'paper f/s':>10}"]

    def line(label, key, paper_key=None, fmt="{:.1f}"):
        a, b = s[key], f[key]
        text = f"{label:<34}{fmt.format(a):>12}{fmt.format(b):>12}{b / a:>10.2f}x"
        if paper_key:
            pa, pb = PAPER["standard"][paper_key], PAPER["flash"][paper_key]
            text += f"   {pa:>10}{pb:>12}{pb / pa:>9.2f}x"
        return text

    lines.append(line("GFLOPs, model (useful)", "model_gflops"))
    lines.append(line("GFLOPs, hardware (with recompute)", "hardware_gflops", "gflops"))
    lines.append(line(f"HBM GB, {'counted' if s['target'] == 'emu' else 'modeled'}", "hbm_gb",
                      "hbm_gb"))
    if "nn_gb" in s:
        lines.append(f"{'  of which N x N (S, P, dP, dS)':<34}{s['nn_gb']:>12.1f}"
                     f"{f['nn_gb']:>12.1f}")
    if "measured_gb" in s:
        lines.append(line("HBM GB, measured (ncu)", "measured_gb"))
    label = "ms, modeled A100 fp32" if s["target"] == "emu" else "ms, measured"
    lines.append(line(label, "time_ms", "ms", "{:.2f}"))
    if "fp16_whatif_ms" in s:
        lines.append(line("ms, what-if A100 fp16, bytes / 2", "fp16_whatif_ms", None, "{:.2f}"))
    if "modeled_ms" in s:
        lines.append(line(f"ms, modeled {s['modeled_device']} fp32", "modeled_ms", None,
                          "{:.2f}"))
    lines.append(f"bytes: {s['hbm_source']}; time: {s['time_source']} (bound: standard "
                 f"{s['bound']}, flash {f['bound']})")
    lines.append("the paper's GFLOPs figure is printed as published; its count convention is not "
                 "stated, so compare the flash/standard ratios")
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
