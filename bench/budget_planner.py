"""ckptlab's recompute plans against torch.compile's own planner, same model, same bytes.

    python bench/budget_planner.py [--out budget_planner] [--budgets 0.2,0.3,...,0.9]

torch.compile with torch._functorch.config.activation_memory_budget = b (a knapsack over the
joint graph's saved tensors, min-cut partitioner; backend aot_eager_decomp_partition, which
runs that partitioner without compiling C++) picks what a torch GPT (ckptlab.torch.nets,
SDPA's math attention) recomputes. For each b, its saved bytes are measured, and ckptlab plans
for exactly those bytes:
  op-level   ckptlab.torch.op_plan: per block and the head, which op outputs to keep (the DP
             over ops chained with the DP over blocks), run as selective checkpointing;
  optimal    ckptlab's block-level optimum (schedule optimal(bytes), whole blocks
             checkpointed; its budget bounds the peak, the replay included);
  keep(matmul)  ckptlab's selective policy on every block (one point, no budget).
Per row: saved bytes at the end of the forward (measured: TorchLedger, saved_tensors_hooks, by
storage; the compiled graph's saves go through the same hooks), the peak of saved bytes
(the replay included, for ckptlab's eager runs; torch's compiled backward replays inside its
graph, where no hook sees it: "-"), recompute FLOPs (counted: FlopCounterMode, the backward's
FLOPs less those of the same method's backward with nothing recomputed; matmul FLOPs only,
pointwise ops count 0) and the step's CPU time, median and IQR over --repeats steps.
Writes budget_planner.csv and budget_planner.png in --out. Needs PyTorch.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

try:
    import torch
except ImportError:
    print("bench/budget_planner.py needs PyTorch (pip install -e '.[torch]'): nothing run")
    sys.exit(0)

import torch._functorch.config as functorch_config
from torch.utils.flop_counter import FlopCounterMode

from ckptlab.torch import nets, op_plan
from ckptlab.torch.ledger import TorchLedger
from ckptlab.torch.schedule import make_schedule

BACKEND = "aot_eager_decomp_partition"


def measure(step, params, repeats: int) -> dict:
    """step() -> loss. Saved bytes at the end of the forward and their peak, backward FLOPs,
    step times (median, IQR) in ms."""
    led = TorchLedger(params)
    with led:
        loss = step()
        end = led.bytes
        loss.backward()
    # FLOPs in a step of their own: FlopCounterMode, active in a backward, keeps a replay's
    # tensors alive (measured: the peak of saved bytes grows), so it never runs with the ledger
    loss = step()
    with FlopCounterMode(display=False) as fc:
        loss.backward()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        step().backward()
        times.append(1e3 * (time.perf_counter() - t))
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return dict(saved=end, peak=led.peak, bwd_flops=fc.get_total_flops(),
                ms=statistics.median(times), iqr=q[2] - q[0])


def compiled(model, x, y, budget: float):
    torch._dynamo.reset()
    functorch_config.activation_memory_budget = budget
    cm = torch.compile(model, backend=BACKEND)
    cm(x, y).backward()  # compiles
    return lambda: cm(x, y)


def run(args) -> list:
    torch.manual_seed(0)
    model = nets.GPT(vocab=args.vocab, ctx=args.seq, width=args.width, heads=args.heads,
                     layers=args.layers, attn="math")
    x = torch.randint(0, args.vocab, (args.batch, args.seq))
    y = torch.randint(0, args.vocab, (args.batch, args.seq))
    params = list(model.parameters())
    rows = []

    def add(budget, method, m, base, note=""):
        rows.append(dict(budget=budget, method=method, saved_bytes=m["saved"],
                         peak_bytes=m["peak"] if method != "torch.compile" else "",
                         recompute_flops=m["bwd_flops"] - base, step_ms=round(m["ms"], 2),
                         step_ms_iqr=round(m["iqr"], 2), note=note))
        r = rows[-1]
        print(f"{budget:>5} {method:<14} saved {r['saved_bytes']:>10,}  recompute "
              f"{r['recompute_flops']:>12,} FLOPs  {r['step_ms']:>7.2f} ms (IQR "
              f"{r['step_ms_iqr']:.2f}) {note}", flush=True)

    eager = measure(lambda: model(x, y), params, args.repeats)
    add(1.0, "none", eager, eager["bwd_flops"])
    torch_base = measure(compiled(model, x, y, 1.0), params, args.repeats)
    add(1.0, "torch.compile", torch_base, torch_base["bwd_flops"])
    prof_ops = op_plan.profile_blocks(op_plan.stages(model, y), x)
    fixed = eager["saved"] - sum(p.plain for p in prof_ops)
    prof = model.profile(x, y)
    keep = measure(lambda: model(x, y, schedule="keep(matmul)"), params, args.repeats)
    add("-", "keep(matmul)", keep, eager["bwd_flops"])
    for b in args.budgets:
        t = measure(compiled(model, x, y, b), params, args.repeats)
        add(b, "torch.compile", t, torch_base["bwd_flops"])
        try:
            choice, _, _ = op_plan.plan(prof_ops, t["saved"] - fixed)
            add(b, "op-level", measure(lambda c=choice: op_plan.run(model, x, y, c), params,
                                       args.repeats), eager["bwd_flops"])
        except ValueError as e:
            print(f"{b:>5} op-level: {e}")
        try:
            sched = make_schedule(f"optimal({t['saved']})", args.layers, prof)
            add(b, "optimal", measure(lambda s=sched: model(x, y, schedule=s), params,
                                      args.repeats), eager["bwd_flops"], str(sched.plan))
        except ValueError as e:
            print(f"{b:>5} optimal: does not fit ({e})")
    return rows


def figure(rows, path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for method, style in (("torch.compile", "o-"), ("op-level", "s--"), ("optimal", "^:"),
                          ("keep(matmul)", "D")):
        pts = sorted((r["saved_bytes"], r["recompute_flops"]) for r in rows
                     if r["method"] == method)
        if pts:
            ax.plot([p[0] / 1e6 for p in pts], [p[1] / 1e6 for p in pts], style, label=method)
    ax.set_xlabel("saved bytes at the end of the forward (MB, measured)")
    ax.set_ylabel("recompute FLOPs (M, counted)")
    ax.set_title("same model, same bytes: torch.compile's planner vs ckptlab's")
    ax.legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="budget_planner")
    p.add_argument("--budgets", default="0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9")
    p.add_argument("--repeats", type=int, default=7)
    for name, default in dict(layers=4, width=64, heads=4, seq=64, batch=4, vocab=64).items():
        p.add_argument(f"--{name}", type=int, default=default)
    args = p.parse_args(argv)
    try:
        args.budgets = [float(b) for b in args.budgets.split(",")]
    except ValueError:
        p.error(f"--budgets: expected numbers separated by commas, got {args.budgets!r}")
    if not all(0 < b <= 1 for b in args.budgets) or args.repeats < 1:
        p.error("--budgets must lie in (0, 1] and --repeats be >= 1")
    torch.set_num_threads(1)
    rows = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "budget_planner.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    figure(rows, out / "budget_planner.png")
    print(f"wrote {out / 'budget_planner.csv'} and {out / 'budget_planner.png'}")
    return 0


if __name__ == "__main__":
    from ckptlab.args import exit_with  # one line for a write error; quiet into | head

    exit_with(main)
