"""Train a small GPT with DDP on more than one process: ckptlab attention and a ckptlab schedule
in every rank, PyTorch's distributed engine between them; and a tensor-parallel block.

    python -m ckptlab.torch.demo --nproc 2 [--steps 3 --schedule "optimal(40%)"]
    python -m ckptlab.torch.demo --fsdp --nproc 4     # FSDP2 instead (ckptlab.torch.fsdp)
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
from ckptlab.torch import nets
from ckptlab.torch import tensor_parallel as tp
from ckptlab.torch.ledger import TorchLedger
from ckptlab.torch.training import (
    TOLERANCE,
    Config,
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


def parse(argv) -> tuple[int, Config, bool]:
    """(nproc, Config, --fsdp) from the command line; every value checked before any work, as the
    other commands do (one line, exit status 2): the argument types of ckptlab.cli.report,
    a model the attention can run, a batch the ranks can split, a schedule that parses and
    fits the model (checked on the one-process profile)."""
    p = argparse.ArgumentParser(prog="python -m ckptlab.torch.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=positive_int, default=2,
                   help=f"processes (ranks), default 2; must divide {tp.Shape().a} (the "
                        "tensor-parallel block's heads) unless --fsdp")
    p.add_argument("--fsdp", action="store_true", help="train under FSDP2 with Adam instead "
                   "(ckptlab.torch.fsdp): bytes per rank by kind")
    types = dict(lr=positive_float, seed=nonnegative_int, schedule=str, attn=str)
    for name, default in asdict(Config()).items():
        p.add_argument(f"--{name}", type=types.get(name, positive_int), default=default,
                       help=f"default {default}".replace("%", "%%"),
                       **({"choices": nets.ATTENTION} if name == "attn" else {}))
    a = vars(p.parse_args(argv))
    nproc, sharded = a.pop("nproc"), a.pop("fsdp")
    cfg = Config(**a)
    heads = tp.Shape().a
    if heads % nproc and not sharded:  # FSDP runs no tensor-parallel block
        p.error(f"--nproc {nproc} must divide {heads}, the heads of the tensor-parallel block")
    if cfg.batch % nproc:
        p.error(f"--batch {cfg.batch} must be divisible by --nproc {nproc} (each rank takes "
                "an equal slice)")
    try:
        nets.check_shape(cfg.width, cfg.heads, cfg.attn)
    except ValueError as e:
        p.error(f"--width {cfg.width} --heads {cfg.heads}: {e}")
    try:
        _plan(cfg)
    except ValueError as e:
        p.error(f"--schedule {cfg.schedule!r}: {e}")
    return nproc, cfg, sharded


def _plan(cfg: Config):
    """The schedule for the one-process model on the whole batch (what the reference runs):
    ValueError if the spec does not parse or fit."""
    with emu.settings(race_check=False):
        cpu = torch.device("cpu")
        model, _ = scheduled_gpt(cfg, cpu, *rank_inputs(cfg, 0, 1, cpu))
    return model.schedule


def _main(argv) -> int:
    torch.set_num_threads(1)  # the reference run's tensors are tiny: one thread is faster
    nproc, cfg, sharded = parse(argv)
    if sharded:
        from ckptlab.torch import fsdp
        return fsdp.main(nproc, cfg)
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
    sys.exit(main())
