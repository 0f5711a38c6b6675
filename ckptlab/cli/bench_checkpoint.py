"""Benchmark: each recompute schedule on the MLP or the GPT, one training step (forward +
backward) per measurement.

Per schedule: the predicted and the measured peak of saved-activation bytes (the ledger, exact),
the allocator's peak (tracemalloc / CuPy pool: gradients and temporaries too), the step time
(median and interquartile range of repeats interleaved with the references, BLAS limited to one
thread in-process), model and hardware FLOPs (hardware = model + recompute) and achieved
FLOP/s. A warning names the rows whose time ranges overlap: their order is not resolved. Two
references: the same NumPy work written by hand without the engine (hand_step: forward and
backward, no checkpointing), for the engine's overhead; and PyTorch with torch.utils.checkpoint
on the same model and plan (CPU, reentrant), its saved tensors counted through
saved_tensors_hooks the same way (ckptlab.torch.ledger.TorchLedger).

    python -m ckptlab bench checkpoint --model mlp --layers 64 --schedule "none,sqrt,revolve(4)"

--png [DIR] draws into the folder DIR (the current one when not given), as bench attention's --png
does: peak memory against measured step time (with its spread) and against recompute FLOPs, one
point per schedule.
"""

from __future__ import annotations

import argparse
import sys
import warnings

import numpy as np

from ckptlab import device, engine, measure, models
from ckptlab.cli.checkpoint_report import figures, table  # the rows read (lab 09: .table)
from ckptlab.cli.hand_step import hand_step
from ckptlab.cli.report import (
    check_bytes,
    positive_int,
    writable_file,
    writable_folder,
    write_csv,
)
from ckptlab.engine import Tensor
from ckptlab.recompute import ledger, schedules
from ckptlab.recompute.plan import Seg

DEFAULT_SCHEDULES = ["none", "sqrt", "every(4)", "revolve(3)", "chen_greedy(25%)",
                     "optimal(40%)", "keep(matmul)"]


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
    # What the schedule asks that the twin cannot do comes first: it holds with or without
    # PyTorch installed, so the table gives the same reason on every machine.
    if any(isinstance(i, Seg) and i.policy for i in sched.plan):
        return None, "keep(...) needs non-reentrant checkpoint"
    if sched.recompute_ops:
        return None, "the twin does not recompute inside an op"
    if device.target() != "emu":
        return None, "the PyTorch twin runs on the CPU only"
    try:
        import torch
    except ImportError:
        return None, "PyTorch is not installed"
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

    from ckptlab.torch.ledger import TorchLedger  # counts by storage, parameters excluded

    led = TorchLedger(params.values())
    with led:
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


def _policies(specs):
    """What the profile must measure for these specs: keep(...) policies, recomputed ops."""
    policies, recompute = [], []
    for spec in specs:
        s = spec.replace(" ", "")
        for word in ("keep(", "selective("):
            if s.startswith(word) and s.endswith(")"):
                policies.append(s[len(word):-1])
        if s in ("recompute(attn)", "recompute(attention)"):
            recompute = [frozenset({"attention"})]
    return sorted(set(policies)), recompute


def run(model: str = "mlp", layers: int = 64, schedule_specs=None, width: int = 64,
        batch: int = 512, seq: int = 64, heads: int = 4, dropout: float = 0.0,
        dtype=np.float32, repeats: int = 7, with_torch: bool = True) -> list:
    """One row (a plain dict) per schedule, after a "by hand" row. Times: median and quartiles
    of `repeats` runs interleaved with the by-hand step, BLAS on one thread; step_over_hand is
    the row's median over the by-hand median, the two numbers the table prints."""
    with measure.blas_threads(1):
        return _run(model, layers, schedule_specs, width, batch, seq, heads, dropout, dtype,
                    repeats, with_torch)


def _times(row: dict, key: str, samples) -> None:
    row[f"{key}_s"], row[f"{key}_q1_s"], row[f"{key}_q3_s"] = measure.quartiles(samples)


def _run(model, layers, schedule_specs, width, batch, seq, heads, dropout, dtype, repeats,
         with_torch) -> list:
    m, x, y = build(model, layers=layers, width=width, batch=batch, seq=seq, heads=heads,
                    dropout=dropout, dtype=dtype)
    specs = list(schedule_specs or DEFAULT_SCHEDULES)
    policies, recompute = _policies(specs)
    prof = m.profile(x, y, policies=policies, recompute=recompute)
    dev = measure.time_fn(lambda: None, repeats=1, warmup=0).device
    base = {"model": model, "layers": layers, "width": width, "batch": batch, "device": dev,
            "dtype": np.dtype(dtype).name, "repeats": repeats}
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
        tstep, note = (torch_step(m, x, y, sched, prof) if with_torch else
                       (None, "not asked for (--no-torch; the tour skips it to keep to a minute)"))
        if tstep is not None:
            fns["torch"], row["torch_saved_peak_bytes"] = tstep, note
        else:
            row["torch_note"] = note
        t = interleaved(fns, repeats)
        hand_samples += t["hand"]
        _times(row, "step", t["engine"])
        if "torch" in t:
            _times(row, "torch_step", t["torch"])
        rows.append(row)
    hand = {**base, "schedule": "by hand (NumPy, no engine)"}
    _times(hand, "step", hand_samples)
    for row in rows:
        row["step_over_hand"] = row["step_s"] / hand["step_s"]
        row["model_gflop_per_s"] = row["model_flops"] / row["step_s"] / 1e9
        row["hardware_gflop_per_s"] = row["hardware_flops"] / row["step_s"] / 1e9
    return [hand] + rows


# ------------------------------------------------------------------------------ CLI


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ckptlab bench checkpoint", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["mlp", "gpt"], default="mlp")
    p.add_argument("--layers", type=positive_int, default=None,
                   help="blocks L (mlp: 64, gpt: 8)")
    p.add_argument("--schedule", default=",".join(DEFAULT_SCHEDULES),
                   help="comma-separated specs, e.g. none,sqrt,every(4),revolve(3),"
                        "optimal(40%%),chen_greedy(25%%),keep(matmul),recompute(attn)")
    p.add_argument("--width", type=positive_int, default=64, help="D (default 64)")
    p.add_argument("--batch", type=positive_int, default=None, help="B (mlp: 512, gpt: 16)")
    p.add_argument("--seq", type=positive_int, default=64, help="gpt: tokens per sequence")
    p.add_argument("--heads", type=positive_int, default=4, help="gpt: attention heads")
    p.add_argument("--dropout", type=float, default=0.0, help="in [0, 1)")
    p.add_argument("--repeats", type=positive_int, default=7,
                   help="interleaved timed runs (default 7)")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch twin")
    p.add_argument("--csv", metavar="FILE", help="also write the rows as CSV ('-': stdout)")
    p.add_argument("--png", metavar="DIR", nargs="?", const=".",
                   help="also draw peak memory against step time and against recompute FLOPs "
                   "into the folder DIR (default: the current one), as bench attention's --png "
                   "does")
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
    if a.csv is not None:
        writable_file(a.csv)
    if a.png is not None:
        writable_folder(a.png, "--png")
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
    if a.csv is not None:
        write_csv(rows, a.csv)
    for path in figures(rows, a.png) if a.png is not None else ():
        print(f"wrote {path}", file=out)
    return 0
