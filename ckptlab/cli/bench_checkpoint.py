"""Benchmark: each recompute schedule on the MLP or the GPT, one training step (forward +
backward) per measurement.

Per schedule: the predicted and the measured peak of saved-activation bytes (the ledger, exact),
the allocator's peak (tracemalloc / CuPy pool: gradients and temporaries too), the step time
(median of repeats interleaved with the references), model and hardware FLOPs (hardware = model
+ recompute) and achieved FLOP/s. Two
references: the same NumPy work written by hand without the engine (hand_step: forward and
backward, no checkpointing), for the engine's overhead; and PyTorch with torch.utils.checkpoint
on the same model and plan (CPU, reentrant), its saved tensors counted through
saved_tensors_hooks the same way.

    python -m ckptlab bench checkpoint --model mlp --layers 64 --schedule "none,sqrt,revolve(4)"

On a shared machine, OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 gives steadier times.
"""

from __future__ import annotations

import argparse
import sys
import warnings
import weakref

import numpy as np

from ckptlab import device, engine, measure, models
from ckptlab.cli.hand_step import hand_step
from ckptlab.cli.report import check_bytes, positive_int, writable_file, write_csv
from ckptlab.engine import Tensor
from ckptlab.recompute import ledger, schedules
from ckptlab.recompute.plan import Seg

DEFAULT_SCHEDULES = ["none", "sqrt", "every(4)", "revolve(3)", "chen_greedy(25%)",
                     "optimal(40%)", "selective(matmul)"]


def build(model: str, *, layers: int, width: int, batch: int, seq: int = 64, heads: int = 4,
          dropout: float = 0.0, dtype=np.float32, seed: int = 0):
    """(model, inputs, targets) of the benchmark, float32 by default."""
    r = np.random.default_rng(seed)
    if model == "mlp":
        m = models.MLP(width=width, layers=layers, classes=16, dropout=dropout, seed=seed,
                       dtype=dtype)
        return m, r.standard_normal((batch, width)).astype(dtype), r.integers(0, 16, batch)
    if model == "gpt":
        m = models.GPT(vocab=256, ctx=seq, width=width, heads=heads, layers=layers,
                       dropout=dropout, seed=seed, dtype=dtype)
        return m, r.integers(0, 256, (batch, seq)), r.integers(0, 256, (batch, seq))
    raise ValueError(f"model: expected 'mlp' or 'gpt', got {model!r}")


def bytes_at_least(model: str, *, layers: int, width: int, batch: int, seq: int = 64,
                   dtype=np.float32) -> int:
    """A lower bound on what one step of build(...) holds, without building it: the weights
    and their gradients (2 x the parameters) and, with no checkpointing, each block's input
    and hidden activation (MLP: B (D + 4D); GPT: B N (C + 4C)). To refuse sizes up front."""
    D, L = width, layers
    if model == "mlp":
        params = L * (2 * D * 4 * D + 4 * D + D) + 16 * D + 16
        acts = L * batch * 5 * D
    else:  # vocab 256, ctx seq: 12 C^2 + 13 C per block, embeddings, final layernorm, head
        params = L * (12 * D * D + 13 * D) + (256 + seq) * D + 2 * D + 256 * D
        acts = L * batch * seq * 5 * D
    return np.dtype(dtype).itemsize * (2 * params + acts)


def _engine_step(m, x, y, sched):
    def step():
        engine.manual_seed(0)
        m.zero_grad()
        m.loss(Tensor(x), y, schedule=sched).backward()
    return step


# ------------------------------------------------------------------------------ PyTorch twin


class TorchLedger:
    """Saved-tensor bytes of PyTorch's graph, counted by storage like ckptlab.recompute.ledger:
    a pack hook acquires, the packed handle's death (when autograd frees it) releases."""

    def __init__(self, params=()):
        self.bytes, self.peak, self._held = 0, 0, {}
        self._params = {p.untyped_storage().data_ptr() for p in params}

    def pack(self, t):
        st = t.untyped_storage()
        key = st.data_ptr()
        if key in self._params:  # a parameter (or a view of one): never counted
            return t
        entry = self._held.setdefault(key, [st.nbytes(), 0])
        if entry[1] == 0:
            self.bytes += entry[0]
            self.peak = max(self.peak, self.bytes)
        entry[1] += 1
        handle = _Handle(t)
        weakref.finalize(handle, self._release, key)
        return handle

    def _release(self, key):
        entry = self._held[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.bytes -= entry[0]
            del self._held[key]

    @staticmethod
    def unpack(h):
        return h.t if isinstance(h, _Handle) else h


class _Handle:
    __slots__ = ("t", "__weakref__")

    def __init__(self, t):
        self.t = t


def _torch_run(stages, plan, x):
    """run_plan's twin: Segs become (nested) torch.utils.checkpoint calls."""
    from torch.utils.checkpoint import checkpoint

    for item in plan:
        if isinstance(item, Seg):
            def fn(t, seg=item):
                return _torch_run(stages, seg.items, t)
            x = checkpoint(fn, x, use_reentrant=True, preserve_rng_state=False)
        else:
            x = stages[item](x)
    return x


def torch_step(m, x, y, sched, prof):
    """(step function, saved-tensor peak) of the PyTorch twin under the same plan, or
    (None, reason) where it cannot run."""
    try:
        import torch
    except ImportError:
        return None, "PyTorch is not installed"
    if device.target() != "emu":
        return None, "the PyTorch twin runs on the CPU only"
    if any(isinstance(i, Seg) and i.policy for i in sched.plan):
        return None, "selective policies need non-reentrant checkpoint: not run"
    engine.manual_seed(0)
    stages, params = models.torch_stages(m, y)
    plan = sched.full_plan(prof)
    inp = torch.as_tensor(x)
    if inp.is_floating_point():
        inp.requires_grad_(True)  # reentrant checkpoint needs an input that wants a gradient

    def step():
        for p in params.values():
            p.grad = None
        with warnings.catch_warnings():  # a nested checkpoint's first pass runs under no_grad
            warnings.filterwarnings("ignore", "None of the inputs have requires_grad")
            _torch_run(stages, plan, inp).backward()

    led = TorchLedger(params.values())
    with torch.autograd.graph.saved_tensors_hooks(led.pack, led.unpack):
        step()
    return step, led.peak


def interleaved(fns: dict, repeats: int) -> dict:
    """Seconds per call of each function, timed in turn within every repeat (one warm-up call
    each first), so that load from other processes hits them all alike: {name: [seconds]}."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(measure.time_fn(fn, repeats=1, warmup=0).median_s)
    return times


# ------------------------------------------------------------------------------ rows


def run(model: str = "mlp", layers: int = 64, schedule_specs=None, width: int = 64,
        batch: int = 512, seq: int = 64, heads: int = 4, dropout: float = 0.0,
        dtype=np.float32, repeats: int = 5, with_torch: bool = True) -> list:
    """One row (a plain dict) per schedule, after a "by hand" row. Times are medians of
    `repeats` interleaved runs; step_over_hand is the median of the per-repeat ratios."""
    m, x, y = build(model, layers=layers, width=width, batch=batch, seq=seq, heads=heads,
                    dropout=dropout, dtype=dtype)
    specs = list(schedule_specs or DEFAULT_SCHEDULES)
    policies = ["matmul"] if any("selective" in s for s in specs) else []
    prof = m.profile(x, y, policies=policies)
    dev = measure.time_fn(lambda: None, repeats=1, warmup=0).device
    base = {"model": model, "layers": layers, "width": width, "batch": batch, "device": dev,
            "dtype": np.dtype(dtype).name}
    hand_samples, rows = [], []
    for spec in specs:
        sched = schedules.make(spec, prof=prof)
        pred = sched.predict(prof)
        step = _engine_step(m, x, y, sched)
        with ledger.record(timeline=False) as led:
            step()
        row = {**base, "schedule": sched.name, "plan": str(sched.plan),
               "predicted_peak_bytes": pred.peak_bytes, "measured_peak_bytes": led.peak,
               "prediction_error": led.peak / pred.peak_bytes - 1.0,
               "allocator_peak_bytes": measure.peak_memory(step),
               "model_flops": led.model_flops, "hardware_flops": led.hardware_flops,
               "predicted_recompute_flops": pred.recompute_flops,
               "hfu_over_mfu": led.hardware_flops / led.model_flops}
        fns = {"hand": lambda: hand_step(m, x, y), "engine": step}
        tstep, note = torch_step(m, x, y, sched, prof) if with_torch else (None, "not asked")
        if tstep is not None:
            fns["torch"], row["torch_saved_peak_bytes"] = tstep, note
        else:
            row["torch_note"] = note
        t = interleaved(fns, repeats)
        hand_samples += t["hand"]
        row["step_s"] = float(np.median(t["engine"]))
        row["step_over_hand"] = float(np.median(np.array(t["engine"]) / np.array(t["hand"])))
        row["model_gflop_per_s"] = led.model_flops / row["step_s"] / 1e9
        row["hardware_gflop_per_s"] = led.hardware_flops / row["step_s"] / 1e9
        if "torch" in t:
            row["torch_step_s"] = float(np.median(t["torch"]))
        rows.append(row)
    hand = {**base, "schedule": "by hand (NumPy, no engine)", "step_s": float(np.median(
        hand_samples))}
    return [hand] + rows


# ------------------------------------------------------------------------------ CLI


def _fmt_bytes(n) -> str:
    return f"{'-':>12}" if n is None else f"{n / 2**20:8.3f} MiB"


def table(rows) -> str:
    head = (f"{'schedule':<26} {'predicted':>12} {'measured':>12} {'err':>6} {'allocator':>12} "
            f"{'step':>9} {'/hand':>6} {'HW/model':>8} {'GFLOP/s':>8} {'torch step':>10} "
            f"{'torch saved':>12}")
    lines = [f"{rows[0]['model']} L={rows[0]['layers']} width={rows[0]['width']} "
             f"batch={rows[0]['batch']} {rows[0]['dtype']} on {rows[0]['device']}", head]
    for r in rows:
        if "predicted_peak_bytes" not in r:
            lines.append(f"{r['schedule']:<26} {'':>52} {r['step_s'] * 1e3:7.1f}ms")
            continue
        ts = f"{r['torch_step_s'] * 1e3:8.1f}ms" if "torch_step_s" in r else f"{'-':>10}"
        lines.append(
            f"{r['schedule']:<26} {_fmt_bytes(r['predicted_peak_bytes'])} "
            f"{_fmt_bytes(r['measured_peak_bytes'])} {r['prediction_error']:6.1%} "
            f"{_fmt_bytes(r['allocator_peak_bytes'])} {r['step_s'] * 1e3:7.1f}ms "
            f"{r['step_over_hand']:6.2f} {r['hfu_over_mfu']:8.3f} "
            f"{r['model_gflop_per_s']:8.2f} {ts} {_fmt_bytes(r.get('torch_saved_peak_bytes'))}")
    lines.append("peaks: saved-activation bytes (ledger; torch: saved_tensors_hooks), allocator: "
                 "tracemalloc/CuPy pool; times: medians of interleaved repeats; /hand: median "
                 "per-repeat ratio; GFLOP/s: model FLOPs")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ckptlab bench checkpoint", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["mlp", "gpt"], default="mlp")
    p.add_argument("--layers", type=positive_int, default=None,
                   help="blocks L (mlp: 64, gpt: 8)")
    p.add_argument("--schedule", default=",".join(DEFAULT_SCHEDULES),
                   help="comma-separated specs, e.g. none,sqrt,every(4),revolve(3),"
                        "optimal(40%%),chen_greedy(25%%),selective(matmul)")
    p.add_argument("--width", type=positive_int, default=64, help="D (default 64)")
    p.add_argument("--batch", type=positive_int, default=None, help="B (mlp: 512, gpt: 16)")
    p.add_argument("--seq", type=positive_int, default=64, help="gpt: tokens per sequence")
    p.add_argument("--heads", type=positive_int, default=4, help="gpt: attention heads")
    p.add_argument("--dropout", type=float, default=0.0, help="in [0, 1)")
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch twin")
    p.add_argument("--csv", metavar="FILE", help="also write the rows as CSV ('-': stdout)")
    a = p.parse_args(argv)
    layers = a.layers if a.layers is not None else (64 if a.model == "mlp" else 8)
    batch = a.batch if a.batch is not None else (512 if a.model == "mlp" else 16)
    specs = [s.strip() for s in a.schedule.split(",")]
    if not all(specs):
        p.error(f"--schedule {a.schedule!r}: expected comma-separated schedules, e.g. none,sqrt")
    if not 0.0 <= a.dropout < 1.0:
        p.error(f"--dropout must be in [0, 1), got {a.dropout}")
    if a.model == "gpt" and a.width % a.heads:
        p.error(f"--width {a.width} must be divisible by --heads {a.heads}")
    if a.csv:
        writable_file(a.csv)
    check_bytes(bytes_at_least(a.model, layers=layers, width=a.width, batch=batch, seq=a.seq),
                f"one step of the {a.model} at L={layers} width={a.width} batch={batch}",
                hint="choose a smaller --batch, --width or --layers")
    try:
        rows = run(a.model, layers, specs, width=a.width, batch=batch, seq=a.seq,
                   heads=a.heads, dropout=a.dropout, repeats=a.repeats,
                   with_torch=not a.no_torch)
    except ValueError as e:
        p.error(str(e))
    out = sys.stderr if a.csv == "-" else sys.stdout
    print(table(rows), file=out)
    if a.csv:
        write_csv(rows, a.csv)
    return 0
