"""What one training run of the demos is (ckptlab.torch.demo with DDP, ckptlab.torch.fsdp with
FSDP2): the model, each rank's share of the batch and the schedule, and how close two runs'
losses must be (one check and one table for both, so a loss that is not a finite number fails
both)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from ckptlab.cluster import step_memory
from ckptlab.torch import gpt_bytes, nets
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


# What check_size allows. Rates are generous on purpose, so that only a run hopeless on any CPU
# is refused: ckptlab's attention on the emulator measured 0.08-0.28 GFLOP/s here (one thread,
# flash forward + backward at N = 64..512, d = 16..64, timed with time.perf_counter); PyTorch's
# fp32 matmuls on one core peak below ~200 GFLOP/s (two AVX-512 FMA units: 2 x 16 x 2 FLOPs a
# cycle at ~3 GHz).
EMU_FLOPS = 1e9
CPU_FLOPS = 2e11
MAX_SECONDS = 3600.0  # a demo: an hour of modeled work is a mistake in the options
HEADROOM = 0.8  # of the available host RAM, as the CLI's size checks (ckptlab.cli.report)
PROCESS_BYTES = 310_000_000  # a rank's own: Python, PyTorch and ckptlab imported (VmHWM measured)


def available_ram() -> int:
    """Bytes of host RAM available now (os.sysconf, as ckptlab.cli.report.free_bytes)."""
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def n_params(cfg: Config) -> int:
    """Parameters of the demos' GPT (nets.GPT: untied head without bias)."""
    return step_memory.nets_gpt(cfg.layers, cfg.width, cfg.heads, cfg.seq, cfg.vocab).params()


def check_size(cfg: Config, nproc: int) -> None:
    """ValueError (one line) before anything is built, if the run cannot fit in the host's RAM
    or would take more than MAX_SECONDS even at generous rates. Modeled: every process (nproc
    ranks and this one, which runs the whole batch) holds PyTorch itself (PROCESS_BYTES), the
    parameters, their gradients and Adam's two states (16 bytes a parameter), and twice what
    its slice saves with nothing recomputed (the saved set and the backward's transients).
    FLOPs of a step: 6 x parameters x tokens plus the causal attention's 6 B N^2 C a layer, for
    the steps and the profile (two more), on the ranks and the one-process reference."""
    shape = step_memory.nets_gpt(cfg.layers, cfg.width, cfg.heads, cfg.seq, cfg.vocab)
    saved = {b: gpt_bytes.stage_bytes(shape, b, cfg.layers, True, True, "none", cfg.attn)
             for b in {cfg.batch, max(1, cfg.batch // nproc)}}
    params = n_params(cfg)
    need = (nproc + 1) * (16 * params + PROCESS_BYTES) + 2 * saved[cfg.batch] \
        + 2 * nproc * saved[max(1, cfg.batch // nproc)]
    have = available_ram()
    if need > HEADROOM * have:
        raise ValueError(f"the model ({params:,} parameters), its activations and PyTorch need ~"
                         f"{need / 1e9:.2f} GB in {nproc + 1} processes, but only "
                         f"{have / 1e9:.2f} GB of host RAM is available (using at most "
                         f"{HEADROOM:.0%}): choose a smaller --seq, --width, --layers, "
                         f"--vocab, --batch or --nproc")
    tokens = cfg.batch * cfg.seq
    attention = 6 * cfg.batch * cfg.seq ** 2 * cfg.width * cfg.layers
    rest = 6 * params * tokens
    runs = 2 * (cfg.steps + 2)  # the ranks' share and the reference, steps and profile
    rate = EMU_FLOPS if cfg.attn in nets.METHODS else CPU_FLOPS
    cores = max(1, min(nproc, os.cpu_count() or 1))
    seconds = runs * (attention / rate + rest / CPU_FLOPS) / cores
    if seconds > MAX_SECONDS:
        raise ValueError(f"{cfg.steps} steps at B={cfg.batch} N={cfg.seq} C={cfg.width} "
                         f"L={cfg.layers} ({cfg.attn} attention) would take at least "
                         f"{seconds / 60:,.0f} minutes on this machine (modeled at generous "
                         f"rates), over the {MAX_SECONDS / 60:.0f} a demo allows: choose "
                         f"smaller sizes or fewer --steps")


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
    # copies, each its own storage: with one sequence a rank, local[:, :-1] is already
    # contiguous, and .contiguous() would hand back a view of the whole batch, whose storage
    # the ledger would count once for both (the embeddings save x, the loss y)
    return local[:, :-1].clone(), local[:, 1:].clone()


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
