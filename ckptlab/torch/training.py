"""What one training run of the demos is (ckptlab.torch.demo with DDP, ckptlab.torch.fsdp with
FSDP2): the model, each rank's share of the batch and the schedule, and how close two runs'
losses must be (one check and one table for both, so a loss that is not a finite number fails
both)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ckptlab.torch import nets
from ckptlab.torch.schedule import make_schedule

# fp32 losses of the same model on the same batch, summed in another order (per-rank means,
# averaged gradients): measured differences are ~1e-7 relative; 1e-5 leaves room for the steps
TOLERANCE = 1e-5


@dataclass
class Config:
    steps: int = 3
    schedule: str = "optimal(40%)"
    layers: int = 4
    width: int = 32
    heads: int = 2
    seq: int = 32
    batch: int = 8  # global: split evenly over the ranks
    vocab: int = 64
    lr: float = 0.1
    attn: str = "flash"
    seed: int = 0


def global_batch(cfg: Config):
    """The token ids of one step, (batch, seq + 1): the same on every rank and in the
    one-process reference run."""
    g = torch.Generator().manual_seed(cfg.seed + 1)
    return torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), generator=g)


def rank_inputs(cfg: Config, rank: int, nproc: int, dev):
    """Rank `rank`'s even share of the global batch on `dev`: inputs and next-token targets."""
    if cfg.batch % nproc:
        raise ValueError(f"batch {cfg.batch} must be divisible by nproc {nproc}")
    n = cfg.batch // nproc
    local = global_batch(cfg)[rank * n:(rank + 1) * n].to(dev)
    return local[:, :-1].contiguous(), local[:, 1:].contiguous()


def scheduled_gpt(cfg: Config, dev, x, y):
    """The demos' GPT on `dev`, profiled on (x, y) and given cfg.schedule (ValueError if it
    does not parse or fit): the model and the peak saved bytes its schedule predicts."""
    model = nets.GPT(vocab=cfg.vocab, ctx=cfg.seq, width=cfg.width, heads=cfg.heads,
                     layers=cfg.layers, attn=cfg.attn, seed=cfg.seed).to(dev)
    prof = model.profile(x, y)
    model.schedule = make_schedule(cfg.schedule, cfg.layers, prof)
    return model, model.schedule.predict(prof).peak_bytes


def loss_mismatches(losses, reference, who: str) -> list[str]:
    """One line per step whose loss (`who`: "with 2 ranks", "rank 1 under FSDP") is not a
    finite number or is off the one-process loss by more than TOLERANCE, relative."""
    bad = []
    for k, (loss, ref) in enumerate(zip(losses, reference, strict=True)):
        if not (math.isfinite(loss) and math.isfinite(ref)):
            bad.append(f"step {k}: loss {loss} {who}, {ref} in one process: training diverged "
                       "(a loss that is not a finite number)")
        elif not abs(loss - ref) <= TOLERANCE * abs(ref):
            bad.append(f"step {k}: loss {loss:.8f} {who}, {ref:.8f} in one process")
    return bad


def loss_table(losses, reference, label: str) -> list[str]:
    """Step, the run's loss (column `label`), the one-process loss, their relative difference."""
    lines = [f"{'step':>4}  {'loss, ' + label:>16} {'loss, 1 process':>16} {'relative diff':>14}"]
    for k, (a, b) in enumerate(zip(losses, reference, strict=True)):
        diff = abs(a - b) / abs(b) if b else math.inf if a != b else 0.0
        lines.append(f"{k:>4}  {a:>16.8f} {b:>16.8f} {diff:>14.1e}")
    return lines
