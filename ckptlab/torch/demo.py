"""Train a small GPT with DDP on more than one process: ckptlab attention and a ckptlab schedule
in every rank, PyTorch's distributed engine between them; and a tensor-parallel block.

    python -m ckptlab.torch.demo --nproc 2 [--steps 3 --schedule "optimal(40%)"]
    python -m ckptlab.torch.demo --fsdp --nproc 4     # FSDP2 instead (ckptlab.torch.fsdp)
    python -m ckptlab.torch.demo --pipeline --nproc 4  # pipeline stages (ckptlab.torch.pipelined)
    torchrun --nproc-per-node 2 -m ckptlab.torch.demo

Each rank takes its slice of the global batch, profiles its model on it (ckptlab.torch.profile),
plans the blocks with the schedule, and trains a few SGD steps under DistributedDataParallel
(gloo on CPUs, where the attention kernels run on ckptlab's emulator; NCCL on GPUs). It prints
each rank's peak of saved-tensor bytes (measured through saved_tensors_hooks) against ckptlab's
prediction for its plan, and the loss of every step against one process training on the whole
batch: DDP averages the ranks' gradients, which is the whole batch's gradient, so the losses
agree up to float32 rounding (summation order); TOLERANCE bounds the relative difference.
The same ranks then run one transformer block split Megatron's way (tensor_parallel.py),
plain and checkpointed, and print what each holds against Korthikanti et al.'s formula.
Exit status 1 if a rank's bytes differ from the prediction or the formula, a loss or a
gradient from the one-process reference, or a loss is not a finite number.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ckptlab import emu
from ckptlab.args import nonnegative_int, positive_float, positive_int, run_command
from ckptlab.torch import dist as cdist
from ckptlab.torch import nets, pipelined
from ckptlab.torch import tensor_parallel as tp
from ckptlab.torch.ledger import TorchLedger
from ckptlab.torch.training import (
    TOLERANCE,
    Config,
    check_size,
    loss_mismatches,
    loss_table,
    rank_inputs,
    scheduled_gpt,
)


def train(rank: int, nproc: int, cfg: Config, ddp: bool = True) -> dict:
    """This rank's part of the run: its losses (averaged over the ranks), its measured peaks
    of saved bytes per step and ckptlab's prediction for its plan. The emulator runs without
    its shared-memory race check (a tool for writing kernels, labs 1-7 and the tests): this
    trains, twice as fast."""
    with emu.settings(race_check=False):
        return _train(rank, nproc, cfg, ddp)


def _train(rank: int, nproc: int, cfg: Config, ddp: bool) -> dict:
    dev = cdist.device_of(rank) if ddp else torch.device("cpu")
    x, y = rank_inputs(cfg, rank, nproc, dev)
    model, predicted = scheduled_gpt(cfg, dev, x, y)
    net = DistributedDataParallel(model) if ddp else model
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    losses, peaks = [], []
    for _ in range(cfg.steps):
        opt.zero_grad(set_to_none=True)
        led = TorchLedger(model.parameters())
        with led:
            loss = net(x, y)
            loss.backward()
        peaks.append(led.peak)
        total = loss.detach().clone()
        if ddp:
            dist.all_reduce(total)
        losses.append(float(total) / (nproc if ddp else 1))
        opt.step()
    return dict(rank=rank, losses=losses, peaks=peaks, predicted=predicted,
                plan=str(model.schedule.plan), device=str(dev))


def _worker(rank: int, nproc: int, cfg: Config, shape: tp.Shape) -> tuple:
    return train(rank, nproc, cfg), tp.measure(rank, nproc, shape)


def run(nproc: int = 2, cfg: Config | None = None, shape: tp.Shape | None = None) -> dict:
    """nproc ranks (new processes): DDP training and the tensor-parallel block; then the
    one-process references of both (in this process)."""
    cfg, shape = cfg or Config(), shape or tp.Shape()
    ranks = cdist.spawn(_worker, nproc, cfg, shape)
    return dict(nproc=nproc, config=asdict(cfg), ranks=[r[0] for r in ranks],
                reference=train(0, 1, cfg, ddp=False), backend=cdist.backend(nproc),
                shape=shape, tp=[r[1] for r in ranks], tp_reference=tp.measure(0, 1, shape))


def check(result: dict) -> list:
    """What disagrees: check_ddp's list, then the tensor-parallel block's bytes off the
    formula or its outputs and gradients off one process."""
    return check_ddp(result) + tp.check(result["tp"], result["tp_reference"], result["shape"])


def check_ddp(result: dict) -> list:
    """What disagrees: a rank's measured peak != its prediction, a loss off the reference."""
    bad = []
    for r in result["ranks"]:
        bad += [f"rank {r['rank']} step {k}: measured {p} bytes, predicted {r['predicted']}"
                for k, p in enumerate(r["peaks"]) if p != r["predicted"]]
    return bad + loss_mismatches(result["ranks"][0]["losses"], result["reference"]["losses"],
                                 f"with {result['nproc']} ranks")


def report(result: dict) -> str:
    cfg, ref = result["config"], result["reference"]
    lines = [f"DDP over {result['backend']}, {result['nproc']} ranks "
             f"({result['ranks'][0]['device']}); GPT L={cfg['layers']} C={cfg['width']} "
             f"heads={cfg['heads']} N={cfg['seq']}, global batch {cfg['batch']}, ckptlab "
             f"{cfg['attn']} attention, schedule {cfg['schedule']}",
             f"{'rank':>4}  {'plan':<28} {'peak saved bytes (measured)':>28} {'predicted':>10}"]
    for r in result["ranks"]:
        lines.append(f"{r['rank']:>4}  {r['plan']:<28} {max(r['peaks']):>28,} "
                     f"{r['predicted']:>10,}")
    lines += loss_table(result["ranks"][0]["losses"], ref["losses"], f"{result['nproc']} ranks")
    bad = check_ddp(result)
    lines.append("all equal (bytes exactly, losses within a relative "
                 f"{TOLERANCE:g})" if not bad else "MISMATCH: " + "; ".join(bad))
    lines += ["", tp.report(result["tp"], result["tp_reference"], result["shape"])]
    return "\n".join(lines)


def _torchrun(cfg: Config) -> int:
    """Under torchrun: every rank trains, rank 0 gathers, runs the reference and reports."""
    rank, world = cdist.init_from_env()
    shape = tp.Shape()
    try:
        mine = (train(rank, world, cfg), tp.measure(rank, world, shape))
        ranks = [None] * world
        dist.all_gather_object(ranks, mine)
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return 0
    result = dict(nproc=world, config=asdict(cfg), ranks=[r[0] for r in ranks],
                  backend=cdist.backend(world), reference=train(0, 1, cfg, ddp=False),
                  shape=shape, tp=[r[1] for r in ranks], tp_reference=tp.measure(0, 1, shape))
    print(report(result))
    return 1 if check(result) else 0


SEED_LIMIT = 2**63 - 1  # torch.manual_seed overflows past a signed 64-bit int
PIPE = {"both": ("gpipe", "1f1b"), "gpipe": ("gpipe",), "1f1b": ("1f1b",)}
MICROBATCHES = 4  # --pipeline's default: 1F1B on up to 4 stages, 2 sequences each (batch 8)
PIPE_SCHEDULE = "every(1)"  # --pipeline's default: a budget below a stage's own plain peak
# (optimal(40%)) cannot fit a stage of one or two blocks


def parse(argv) -> tuple[int, Config, str, dict]:
    """(nproc, Config, mode "ddp" | "fsdp" | "pipeline", the pipeline's options) from the
    command line; every value checked before any work, as the other commands do (one line, exit
    status 2): the argument types of ckptlab.cli.report, a model the attention can run, a batch
    the ranks (or micro-batches) can split, sizes that fit in memory and time
    (training.check_size), a schedule that parses and fits the model (checked on the
    one-process profile, or on every stage's)."""
    p = argparse.ArgumentParser(prog="python -m ckptlab.torch.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=positive_int, default=2,
                   help=f"processes (ranks), default 2; must divide {tp.Shape().a} (the "
                        "tensor-parallel block's heads) unless --fsdp or --pipeline")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--fsdp", action="store_true", help="train under FSDP2 with Adam instead "
                      "(ckptlab.torch.fsdp): bytes per rank by kind")
    mode.add_argument("--pipeline", action="store_true", help="train with torch.distributed."
                      "pipelining instead, one stage a rank (ckptlab.torch.pipelined): each "
                      "stage's bytes with its micro-batches in flight")
    p.add_argument("--microbatches", type=positive_int, default=None,
                   help="--pipeline: micro-batches a step, default 4; must divide --batch "
                        "(1F1B: at least --nproc)")
    p.add_argument("--pipe-schedule", choices=sorted(PIPE), default=None,
                   help="--pipeline: GPipe, 1F1B or both (default)")
    types = dict(lr=positive_float, seed=nonnegative_int, schedule=str, attn=str)
    for name, default in asdict(Config()).items():
        extra = f" ({PIPE_SCHEDULE} with --pipeline)" if name == "schedule" else ""
        p.add_argument(f"--{name}", type=types.get(name, positive_int),
                       default=None if name == "schedule" else default,
                       help=f"default {default}{extra}".replace("%", "%%"),
                       **({"choices": nets.ATTENTION} if name == "attn" else {}))
    a = vars(p.parse_args(argv))
    nproc, sharded, piped = a.pop("nproc"), a.pop("fsdp"), a.pop("pipeline")
    m, kinds = a.pop("microbatches"), a.pop("pipe_schedule")
    if not piped and (m, kinds) != (None, None):
        p.error(f"--{'microbatches' if m is not None else 'pipe-schedule'} is an option of "
                "--pipeline")
    pipe = dict(kinds=PIPE[kinds or "both"], m=m or MICROBATCHES)
    if a["schedule"] is None:
        a["schedule"] = PIPE_SCHEDULE if piped else Config.schedule
    cfg = Config(**a)
    if cfg.seed >= SEED_LIMIT:
        p.error(f"--seed: expected an integer in [0, {SEED_LIMIT - 1}] (torch's generators take "
                f"a 64-bit seed, and the batch's is --seed + 1), got {cfg.seed}")
    heads = tp.Shape().a
    if heads % nproc and not (sharded or piped):  # only DDP runs the tensor-parallel block
        p.error(f"--nproc {nproc} must divide {heads}, the heads of the tensor-parallel block")
    if piped:
        _check_pipeline(p, nproc, cfg, pipe)
    elif cfg.batch % nproc:
        p.error(f"--batch {cfg.batch} must be divisible by --nproc {nproc} (each rank takes "
                "an equal slice)")
    try:
        nets.check_shape(cfg.width, cfg.heads, cfg.attn)
    except ValueError as e:
        p.error(f"--width {cfg.width} --heads {cfg.heads}: {e}")
    try:
        check_size(cfg, nproc)
    except ValueError as e:
        p.error(str(e))
    try:
        pipelined.plans(cfg, nproc, pipe["m"]) if piped else _plan(cfg)
    except ValueError as e:
        p.error(f"--schedule {cfg.schedule!r}: {e}")
    return nproc, cfg, "pipeline" if piped else "fsdp" if sharded else "ddp", pipe


def _check_pipeline(p, nproc: int, cfg: Config, pipe: dict) -> None:
    """--pipeline's own rules: a block for every stage, equal micro-batches, and 1F1B's
    (torch's Schedule1F1B refuses fewer micro-batches than stages)."""
    m = pipe["m"]
    if cfg.layers < nproc:
        p.error(f"--layers {cfg.layers} cannot fill --nproc {nproc} stages (one block each "
                "at least)")
    if cfg.batch % m:
        p.error(f"--batch {cfg.batch} must be divisible by --microbatches {m} (equal "
                "micro-batches: their mean losses average to the batch's)")
    if "1f1b" in pipe["kinds"] and m < nproc:
        p.error(f"--microbatches {m}: 1F1B needs at least one per stage (--nproc {nproc}); "
                "give more, or --pipe-schedule gpipe")


def _plan(cfg: Config):
    """The schedule for the one-process model on the whole batch (what the reference runs):
    ValueError if the spec does not parse or fit."""
    with emu.settings(race_check=False):
        cpu = torch.device("cpu")
        model, _ = scheduled_gpt(cfg, cpu, *rank_inputs(cfg, 0, 1, cpu))
    return model.schedule


def _main(argv) -> int:
    torch.set_num_threads(1)  # the reference run's tensors are tiny: one thread is faster
    nproc, cfg, mode, pipe = parse(argv)
    if mode == "fsdp":
        from ckptlab.torch import fsdp
        return fsdp.main(nproc, cfg)
    if mode == "pipeline":
        return pipelined.main(nproc, cfg, pipe["kinds"], pipe["m"])
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return _torchrun(cfg)
    result = run(nproc, cfg)
    print(report(result))
    return 1 if check(result) else 0


def main(argv=None) -> int:
    """The command: a bad option is one line on stderr and exit status 2 (as in
    `python -m ckptlab`); a disagreement, or a loss that is not finite, exit status 1."""
    return run_command(_main, sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    from ckptlab.args import exit_with

    exit_with(main)
