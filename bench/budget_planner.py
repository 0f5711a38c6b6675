"""ckptlab's recompute plans against torch.compile's own planner on one torch GPT: what each
holds and what each redoes, every quantity measured the same way for both.

    python bench/budget_planner.py [--out budget_planner] [--budgets 0.2,0.5,0.8] [--repeats 7]

The model: a ckptlab.torch.nets GPT with SDPA's math attention (--layers, --width, --heads,
--seq, --batch, --vocab). What plans what, at each budget b in (0, 1]:
  torch.compile  torch._functorch.config.activation_memory_budget = b, backend
                 aot_eager_decomp_partition (the min-cut partitioner, no C++ compiler). Its
                 knapsack keeps, by its own size estimate, least + b (default - least) bytes,
                 least the graph's inputs, default what it saves with no budget, and picks
                 what to recompute by its runtime estimate "flops" (matmul FLOPs). Its backward
                 graph runs the recomputed ops where the graph puts them (inductor would
                 reorder them; not measured here).
  op-level       ckptlab.torch.op_plan, planned first, from its own profile, never from
                 torch's bytes: least + b (plain - least) bytes at the end of the forward, least
                 every block keeping its input only, plain nothing recomputed; which matmul
                 outputs each block and the head keep (fewest replayed matmul FLOPs), run eagerly
                 as PyTorch selective checkpointing.
  op-level(time) the same budget, planned by modeled time instead of FLOPs (op_plan's
                 cost="time": each op a launch plus the larger of its FLOPs and its bytes at this
                 CPU's rates, measured first: op_plan.TimeModel.measure), every replayed op
                 counted;
  op-level@torch the FLOP planner given the bytes torch.compile measured at b (same bytes).
  optimal        ckptlab's block-level optimum, optimal(b x 100%): whole blocks checkpointed,
                 its budget b of the plain peak (the replay included).
and once: none (eager, nothing recomputed), torch.compile at b = 1, keep(matmul) (ckptlab's
selective policy on every block). Per row, each measured the same way for every row:
  saved      bytes saved for the backward at the end of the forward (TorchLedger: saved-tensor
             hooks, by storage; the compiled graph's saves go through the same hooks);
  peak       the most bytes allocated above the step's start, forward and backward
             (torch.profiler's CPU allocator events: every tensor, a replay's and the
             gradients' included);
  FLOPs      recompute FLOPs: the backward's FlopCounterMode count less that of the same
             execution (eager, or compiled at b = 1) with nothing recomputed: matmuls only;
  replayed   ATen ops run again in the backward and the bytes they write, against the same
             execution with nothing recomputed: every op counted (LayerNorm, softmax, GeLU,
             the adds), the cost that FLOPs leave out;
  ms         the step's CPU time, median and IQR over --repeats steps, and the replay's time:
             the median less that of the same execution with nothing recomputed.
A budget where torch.compile and op-level both recompute 0 FLOPs is flagged (both 0): there
the FLOPs say nothing about either planner. Writes budget_planner.csv and budget_planner.png in
--out. Needs PyTorch.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time

try:
    import torch
except ImportError:
    print("bench/budget_planner.py needs PyTorch (pip install -e '.[torch]'): nothing run")
    sys.exit(0)

import torch._functorch.config as functorch_config
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from ckptlab.args import UsageError, positive_int, run_command
from ckptlab.cli.report import TooBig, check_bytes, writable_folder
from ckptlab.cluster import step_memory
from ckptlab.torch import gpt_bytes, nets, op_plan
from ckptlab.torch.ledger import TorchLedger
from ckptlab.torch.schedule import make_schedule

BACKEND = "aot_eager_decomp_partition"
CPU_FLOPS = 2e11  # generous: one core's fp32 peak is below it (ckptlab.torch.training)
MAX_SECONDS = 3600.0  # a bench of an hour's modeled work is a mistake in the options
SIZES = dict(layers=4, width=64, heads=4, seq=64, batch=4, vocab=64)


class _Replayed(TorchDispatchMode):
    """Every ATen call and the bytes its outputs take."""

    def __init__(self):
        super().__init__()
        self.ops = self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        self.bytes += sum(t.numel() * t.element_size() for t in tree_leaves(out)
                          if isinstance(t, torch.Tensor))
        return out


def allocated_peak(step) -> int:
    """The most bytes allocated above the step's start, forward and backward (the profiler's
    CPU allocator events: each tensor's creation and destruction)."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler import _memory_profiler as mp
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as p:
        step().backward()
    now = most = 0
    for _, action, _, size in mp.MemoryProfile(p.profiler.kineto_results).timeline:
        now += size if action == mp.Action.CREATE else -size if action == mp.Action.DESTROY \
            else 0
        most = max(most, now)
    return most


def measure(step, params, zero_grad, repeats: int) -> dict:
    """step() -> loss. Each quantity in a step of its own (FlopCounterMode and the op count,
    active in a backward, keep a replay's tensors alive, so neither runs with the ledger or the
    profiler): saved bytes at the end of the forward, the allocated peak, the backward's FLOPs,
    ops and bytes, the step's times (median, IQR) in ms."""
    led = TorchLedger(params)
    with led:
        loss = step()
        end = led.bytes
        loss.backward()
    zero_grad()
    peak = allocated_peak(step)
    zero_grad()
    loss = step()
    with FlopCounterMode(display=False) as fc:
        loss.backward()
    zero_grad()
    loss = step()
    with _Replayed() as ops:
        loss.backward()
    times = []
    for _ in range(repeats):
        zero_grad()
        t = time.perf_counter()
        step().backward()
        times.append(1e3 * (time.perf_counter() - t))
    zero_grad()
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return dict(saved=end, peak=peak, flops=fc.get_total_flops(), ops=ops.ops,
                op_bytes=ops.bytes, ms=statistics.median(times), iqr=q[2] - q[0])


def compiled(model, x, y, budget: float):
    torch._dynamo.reset()
    functorch_config.activation_memory_budget = budget
    cm = torch.compile(model, backend=BACKEND)
    cm(x, y).backward()  # compiles
    model.zero_grad(set_to_none=True)
    return lambda: cm(x, y)


def _row(budget, method, m, base, budget_bytes="", note="") -> dict:
    """One row: m measured, base the same execution with nothing recomputed."""
    return dict(budget=budget, method=method, budget_bytes=budget_bytes, saved_bytes=m["saved"],
                peak_bytes=m["peak"], recompute_flops=m["flops"] - base["flops"],
                replayed_ops=m["ops"] - base["ops"],
                replayed_bytes=m["op_bytes"] - base["op_bytes"],
                step_ms=round(m["ms"], 2), step_ms_iqr=round(m["iqr"], 2),
                replay_ms=round(m["ms"] - base["ms"], 2), note=note)


def _print(r) -> None:
    print(f"{r['budget']:>5} {r['method']:<15} saved {r['saved_bytes']:>10,}  peak "
          f"{r['peak_bytes']:>10,}  recompute {r['recompute_flops']:>11,} FLOPs  replayed "
          f"{r['replayed_ops']:>4} ops {r['replayed_bytes']:>11,} B  {r['step_ms']:>7.2f} ms "
          f"(IQR {r['step_ms_iqr']:.2f}, replay {r['replay_ms']:+.2f}) {r['note']}", flush=True)


def run(args) -> list:
    torch.manual_seed(0)
    model = nets.GPT(vocab=args.vocab, ctx=args.seq, width=args.width, heads=args.heads,
                     layers=args.layers, attn="math")
    x = torch.randint(0, args.vocab, (args.batch, args.seq))
    y = torch.randint(0, args.vocab, (args.batch, args.seq))
    params, zero = list(model.parameters()), lambda: model.zero_grad(set_to_none=True)
    rows = []

    def add(*a, **kw):
        rows.append(_row(*a, **kw))
        _print(rows[-1])

    eager = measure(lambda: model(x, y), params, zero, args.repeats)
    add("-", "none", eager, eager)
    torch_base = measure(compiled(model, x, y, 1.0), params, zero, args.repeats)
    add("-", "torch.compile", torch_base, torch_base, note="no budget (b = 1)")
    tm = op_plan.TimeModel.measure()
    print(f"time model (measured here, medians): launch {tm.launch_s * 1e6:.1f} us, "
          f"{tm.flops_per_s / 1e9:.1f} GFLOP/s, {tm.bytes_per_s / 1e9:.1f} GB/s")
    prof_ops = op_plan.profile_blocks(op_plan.stages(model, y), x, time_model=tm)
    fixed = eager["saved"] - sum(p.plain for p in prof_ops)
    plain = sum(p.plain for p in prof_ops)
    least = sum(p.frontier[0][0] for p in prof_ops)
    prof = model.profile(x, y)
    add("-", "keep(matmul)", measure(lambda: model(x, y, schedule="keep(matmul)"), params,
                                     zero, args.repeats), eager)
    for b in args.budgets:
        # ckptlab plans first, on its own profile: what it will hold is fixed before torch runs
        mine = int(least + b * (plain - least))
        choice, _, _ = op_plan.plan(prof_ops, mine)
        ours = measure(lambda c=choice: op_plan.run(model, x, y, c), params, zero, args.repeats)
        choice, _, _ = op_plan.plan(prof_ops, mine, cost="time")
        timed = measure(lambda c=choice: op_plan.run(model, x, y, c), params, zero, args.repeats)
        theirs = measure(compiled(model, x, y, b), params, zero, args.repeats)
        both0 = ours["flops"] == eager["flops"] and theirs["flops"] == torch_base["flops"]
        note = "both 0 FLOPs: says nothing about either planner" if both0 else ""
        add(b, "torch.compile", theirs, torch_base, note=note)
        add(b, "op-level", ours, eager, mine + fixed, note)
        add(b, "op-level(time)", timed, eager, mine + fixed)
        try:
            choice, _, _ = op_plan.plan(prof_ops, theirs["saved"] - fixed)
            add(b, "op-level@torch", measure(lambda c=choice: op_plan.run(model, x, y, c),
                                             params, zero, args.repeats), eager, theirs["saved"])
        except ValueError as e:
            print(f"{b:>5} op-level@torch: {e}")
        try:
            sched = make_schedule(f"optimal({b * 100:g}%)", args.layers, prof)
            add(b, "optimal", measure(lambda s=sched: model(x, y, schedule=s), params, zero,
                                      args.repeats), eager, note=str(sched.plan))
        except ValueError as e:
            print(f"{b:>5} optimal: does not fit ({e})")
    return rows


def verdict(rows) -> list[str]:
    """Per budget: op-level (planned first) against torch.compile, quantity by quantity."""
    lines = ["op-level (planned first, by FLOPs) / torch.compile at the same budget: saved, "
             "peak, recompute FLOPs, replayed bytes, replay ms (and by time)"]
    by = {(r["budget"], r["method"]): r for r in rows}
    for b in sorted({r["budget"] for r in rows if isinstance(r["budget"], float)}):
        ours, theirs = by.get((b, "op-level")), by.get((b, "torch.compile"))
        if ours is None or theirs is None:
            continue
        ratio = [_ratio(ours[k], theirs[k]) for k in ("saved_bytes", "peak_bytes",
                                                      "recompute_flops", "replayed_bytes")]
        timed = by.get((b, "op-level(time)"))
        lines.append(f"{b:>5}  " + "  ".join(ratio) + f"  {ours['replay_ms']:+.2f} vs "
                     f"{theirs['replay_ms']:+.2f} ms"
                     + (f" (by time {timed['replay_ms']:+.2f})" if timed else "")
                     + (f"  ({ours['note']})" if ours["note"] else ""))
    return lines


def _ratio(a, b) -> str:
    return f"{a / b:>6.2f}x" if b else ("  both 0" if a == 0 else f"{a:>+6,} vs 0")


def figure(rows, path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(11, 4.5))
    FigureCanvasAgg(fig)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for method, style in (("torch.compile", "o-"), ("op-level", "s--"),
                          ("op-level(time)", "v--"), ("op-level@torch", "x:"), ("optimal", "^:"),
                          ("keep(matmul)", "D")):
        pts = sorted((r["saved_bytes"], r["recompute_flops"], r["peak_bytes"], r["replay_ms"])
                     for r in rows if r["method"] == method)
        if pts:
            left.plot([p[0] / 1e6 for p in pts], [p[1] / 1e6 for p in pts], style, label=method)
            right.plot([p[2] / 1e6 for p in pts], [p[3] for p in pts], style[0],
                       linestyle="none", label=method)  # points, not a curve
    left.set_xlabel("saved bytes at the end of the forward (MB, measured)")
    left.set_ylabel("recompute FLOPs (M, counted: matmuls)")
    right.set_xlabel("allocated peak of the step (MB, measured)")
    right.set_ylabel("replay time (ms, step median less the plain step's)")
    left.set_title("what the planners optimise")
    right.set_title("what a step costs")
    left.legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")


def budgets(text: str) -> list[float]:
    """'0.2,0.5' -> [0.2, 0.5]: finite numbers in (0, 1]."""
    try:
        values = [float(b) for b in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers in (0, 1] separated by commas, got "
                                         f"{text!r}") from None
    if not all(math.isfinite(b) and 0 < b <= 1 for b in values):
        raise argparse.ArgumentTypeError(f"expected numbers in (0, 1], got {text!r}")
    return values


def check_size(args) -> None:
    """TooBig (one line) before anything is built: the model, its gradients and the saved
    activations of its plain step (gpt_bytes), three times over (the eager and compiled copies
    of the saved set, the replays), against the host's RAM; and the modeled time of the steps
    the bench runs (CPU_FLOPS) against MAX_SECONDS."""
    shape = step_memory.nets_gpt(args.layers, args.width, args.heads, args.seq, args.vocab)
    saved = gpt_bytes.stage_bytes(shape, args.batch, args.layers, True, True, "none", "math")
    check_bytes(8 * shape.params() + 3 * saved, f"a GPT of {shape.params():,} parameters at "
                f"B={args.batch} N={args.seq}", target="emu", hint="choose smaller sizes")
    flops = 6 * shape.params() * args.batch * args.seq \
        + 12 * args.batch * args.seq ** 2 * args.width * args.layers
    steps = (args.repeats + 4) * (3 + 5 * len(args.budgets))
    if steps * flops / CPU_FLOPS > MAX_SECONDS:
        raise TooBig(f"{steps} steps of {flops:.3g} FLOPs would take at least "
                     f"{steps * flops / CPU_FLOPS / 60:,.0f} minutes (modeled at {CPU_FLOPS:g} "
                     f"FLOP/s), over the {MAX_SECONDS / 60:.0f} allowed: choose smaller sizes, "
                     f"fewer --budgets or --repeats")


def _main(argv) -> int:
    p = argparse.ArgumentParser(prog="python bench/budget_planner.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="budget_planner", help="folder of the CSV and the figure")
    p.add_argument("--budgets", type=budgets, default=budgets("0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9"),
                   help="fractions in (0, 1], comma-separated (default 0.2 ... 0.9)")
    p.add_argument("--repeats", type=positive_int, default=7)
    for name, default in SIZES.items():
        p.add_argument(f"--{name}", type=positive_int, default=default,
                       help=f"default {default}")
    args = p.parse_args(argv)
    try:
        nets.check_shape(args.width, args.heads, "math")
    except ValueError as e:
        p.error(f"--width {args.width} --heads {args.heads}: {e}")
    try:
        check_size(args)
    except TooBig as e:
        raise UsageError(str(e)) from None
    out = writable_folder(args.out)
    torch.set_num_threads(1)
    rows = run(args)
    print("\n".join(verdict(rows)))
    try:
        with open(out / "budget_planner.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        figure(rows, out / "budget_planner.png")
    except OSError as e:
        print(f"error: {out}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(f"wrote {out / 'budget_planner.csv'} and {out / 'budget_planner.png'}")
    return 0


def main(argv=None) -> int:
    """One line and exit status 2 for a bad option, before any work (the CLI's rule)."""
    return run_command(_main, sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    from ckptlab.args import exit_with  # one line for a write error; quiet into | head

    exit_with(main)
