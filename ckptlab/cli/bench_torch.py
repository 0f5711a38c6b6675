"""Benchmark: one training step (forward + backward) of the torch GPT (ckptlab.torch.nets) per
attention: ckptlab's kernels through ckptlab.torch.attention against PyTorch's own
scaled_dot_product_attention, on its math backend (the CPU's reference path) and as it picks.

Per attention: the step's median time with the 10th-90th percentile spread (repeats
interleaved, so load from other processes hits every attention alike), the ratio to the math
path (median of the per-repeat ratios), and the peak of saved-tensor bytes (TorchLedger:
saved_tensors_hooks, by storage, exact). On a CPU the kernels run on ckptlab's emulator ("fast"
build by default: the "counted" one counts every byte, several times slower), so this measures
the emulator against PyTorch's CPU kernels, not a GPU.

    python -m ckptlab bench torch --layers 4 --seq 64 --batch 4 --attn flash,naive,math
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from ckptlab import emu
from ckptlab.cli.bench_checkpoint import bytes_at_least
from ckptlab.cli.report import check_bytes, positive_int, writable_file, write_csv


def run(attns=("flash", "math"), layers: int = 4, width: int = 64, heads: int = 4,
        seq: int = 64, batch: int = 4, repeats: int = 7, threads: int = 1,
        emu_mode: str = "fast") -> list:
    """One row per attention (see the module's docstring)."""
    try:
        import torch

        from ckptlab.measure import timing
        from ckptlab.torch import TorchLedger, nets
    except ImportError as e:
        raise SystemExit(f"bench torch: {e}") from None
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (batch, seq), generator=g)
    y = torch.randint(0, 256, (batch, seq), generator=g)
    steps, peaks = {}, {}
    for attn in attns:
        model = nets.GPT(vocab=256, ctx=seq, width=width, heads=heads, layers=layers,
                         attn=attn, seed=0)

        def step(model=model):
            model.zero_grad(set_to_none=True)
            model(x, y).backward()

        with TorchLedger(model.parameters()) as led:
            step()
        steps[attn], peaks[attn] = step, led.peak
    with emu.settings(mode=emu_mode, race_check=False):
        for step in steps.values():  # warm-up: the emulator loads its kernels here
            step()
        samples = {a: [] for a in steps}
        for _ in range(repeats):
            for a, step in steps.items():
                samples[a].append(timing.time_fn(step, repeats=1, warmup=0, target="emu")
                                  .median_s)
    base = samples.get("math")
    rows = []
    for a, s in samples.items():
        s = np.asarray(s)
        p10, med, p90 = np.percentile(s, [10, 50, 90])
        rows.append(dict(attention=a, layers=layers, width=width, heads=heads, seq=seq,
                         batch=batch, threads=threads, emu_mode=emu_mode,
                         step_s=float(med), p10_s=float(p10), p90_s=float(p90),
                         over_math=float(np.median(s / np.asarray(base))) if base else None,
                         saved_peak_bytes=peaks[a], device=timing.time_fn(
                             lambda: None, repeats=1, warmup=0, target="emu").device))
    return rows


def table(rows) -> str:
    r0 = rows[0]
    lines = [f"torch GPT L={r0['layers']} C={r0['width']} heads={r0['heads']} N={r0['seq']} "
             f"B={r0['batch']}, one training step, {r0['device']}, {r0['threads']} torch "
             f"thread(s), emulator '{r0['emu_mode']}'",
             f"{'attention':<10} {'median':>10} {'p10..p90':>20} {'/math':>7} "
             f"{'saved peak':>14}"]
    for r in rows:
        ratio = f"{r['over_math']:7.2f}" if r["over_math"] is not None else f"{'-':>7}"
        lines.append(f"{r['attention']:<10} {r['step_s'] * 1e3:8.1f}ms "
                     f"{r['p10_s'] * 1e3:9.1f}..{r['p90_s'] * 1e3:.1f}ms {ratio} "
                     f"{r['saved_peak_bytes']:>14,}")
    lines.append("times: medians of interleaved repeats (perf_counter); /math: median per-repeat "
                 "ratio to SDPA's math path; saved peak: saved_tensors_hooks, by storage")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ckptlab bench torch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attn", default="flash,naive,math",
                   help="comma-separated: ckptlab methods (naive, flash, ...), math, sdpa")
    p.add_argument("--layers", type=positive_int, default=4)
    p.add_argument("--width", type=positive_int, default=64)
    p.add_argument("--heads", type=positive_int, default=4)
    p.add_argument("--seq", type=positive_int, default=64)
    p.add_argument("--batch", type=positive_int, default=4)
    p.add_argument("--repeats", type=positive_int, default=7)
    p.add_argument("--threads", type=positive_int, default=1,
                   help="torch.set_num_threads (default 1)")
    p.add_argument("--emu-mode", choices=["fast", "counted"], default="fast")
    p.add_argument("--csv", metavar="FILE", help="also write the rows as CSV")
    a = p.parse_args(argv)
    try:
        from ckptlab.torch.nets import ATTENTION, check_shape
    except ImportError as e:
        p.error(str(e))
    attns = [s.strip() for s in a.attn.split(",") if s.strip()]
    if not attns or any(s not in ATTENTION for s in attns):
        p.error(f"--attn: expected names from {list(ATTENTION)}, got {a.attn!r}")
    for attn in attns:
        try:
            check_shape(a.width, a.heads, attn)
        except ValueError as e:
            p.error(f"--width {a.width} --heads {a.heads}: {e}")
    cpus = os.cpu_count() or 1
    if a.threads > cpus:
        p.error(f"--threads {a.threads}: at most the {cpus} CPUs here")
    if a.csv is not None:
        writable_file(a.csv)
    # the same GPT as bench checkpoint's (vocab 256, context --seq): its bytes at the least
    check_bytes(bytes_at_least("gpt", layers=a.layers, width=a.width, batch=a.batch, seq=a.seq),
                f"one step of the torch GPT at L={a.layers} width={a.width} batch={a.batch} "
                f"seq={a.seq}", hint="choose a smaller --layers, --width, --batch or --seq")
    rows = run(attns, a.layers, a.width, a.heads, a.seq, a.batch, a.repeats, a.threads,
               a.emu_mode)
    print(table(rows))
    if a.csv is not None:
        write_csv(rows, a.csv)
    return 0
