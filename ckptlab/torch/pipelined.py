"""A small GPT trained with PyTorch's own pipeline parallelism (torch.distributed.pipelining),
one stage per rank, a ckptlab schedule over the blocks inside each stage, and what each stage
holds, measured against ckptlab's prediction.

    result = run(2, Config(...), microbatches=4)    # GPipe and 1F1B, 2 ranks (gloo on CPUs)
    python -m ckptlab.torch.demo --pipeline --nproc 4

Every rank builds the whole GPT from the same seed and keeps its stage (pipeline.split_layers:
the first also the embeddings, the last also the head); torch's schedule splits the global
batch into m micro-batches and sends the activations between the ranks. Each stage profiles
its chain on micro-batch 0 (its real input: the earlier stages run here on it, from the same
weights) and plans its blocks with the schedule. What each stage reports:
  saved      the peak of saved-tensor bytes over the step (TorchLedger), every micro-batch
             the stage holds at once included;
  predicted  ckptlab's prediction: its Schedule.predict for one micro-batch, the micro-batches
             side by side in the order the pipeline schedule runs them (pipeline.stage_peak);
  modeled    the same in closed form (pipeline.modeled), for the schedules none and every(1).
The losses and the first step's gradients equal one process training on the whole batch, up
to float32 rounding (training.TOLERANCE): the schedule averages the micro-batches' gradients
(scale_grads), and equal micro-batches' mean losses average to the batch's.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ckptlab import emu
from ckptlab.cluster import step_memory
from ckptlab.torch import dist as cdist
from ckptlab.torch import nets, pipeline
from ckptlab.torch.ledger import TorchLedger
from ckptlab.torch.profile import profile
from ckptlab.torch.recomputing import recomputing
from ckptlab.torch.schedule import make_schedule, run_plan
from ckptlab.torch.training import TOLERANCE, Config, global_batch, loss_mismatches

RECOMPUTE = {"none": "none", "every(1)": "full"}  # the schedules pipeline.modeled knows


def loss_fn(logits, targets):
    """The last stage's loss: nets.LMHead's cross-entropy on its logits."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class Stage(nn.Module):
    """Blocks `blocks` of a nets.GPT, with its embeddings if `first`, its head's LayerNorm and
    projection (the logits) if `last`; the blocks run as self.schedule says."""

    def __init__(self, gpt, blocks: range, first: bool, last: bool):
        super().__init__()
        self.embed = gpt.embed if first else None
        self.blocks = nn.ModuleList(gpt.blocks[i] for i in blocks)
        self.head = gpt.head if last else None
        self.schedule = None

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x)
        with recomputing(self.schedule.recompute_ops):
            x = run_plan(self.blocks, self.schedule.plan, x)
        return self.head.out(self.head.ln(x)) if self.head is not None else x

    def chain(self, targets) -> tuple[list, int]:
        """(modules, index of the first block) as ckptlab.torch.profile measures the stage: the
        head with its loss on `targets`, as one module (nets' own, the same ops)."""
        pre = [self.embed] if self.embed is not None else []
        post = [nets._WithTargets(self.head, targets)] if self.head is not None else []
        return [*pre, *self.blocks, *post], len(pre)


def _gpt(cfg: Config, dev) -> nets.GPT:
    return nets.GPT(vocab=cfg.vocab, ctx=cfg.seq, width=cfg.width, heads=cfg.heads,
                    layers=cfg.layers, attn=cfg.attn, seed=cfg.seed).to(dev)


def batch(cfg: Config, dev):
    """The global batch's inputs and next-token targets, each its own storage."""
    tokens = global_batch(cfg).to(dev)
    return tokens[:, :-1].clone(), tokens[:, 1:].clone()


def planned_stage(cfg: Config, stage: int, stages: int, m: int, dev) -> tuple:
    """(Stage, its profile on micro-batch 0, ValueError text or None): the stage of a fresh GPT
    with cfg.schedule planned on its own micro-batch-0 input, which the earlier stages compute
    here from the same weights."""
    gpt = _gpt(cfg, dev)
    parts = pipeline.split_layers(cfg.layers, stages)
    first, last = stage == 0, stage == stages - 1
    mod = Stage(gpt, parts[stage], first, last)
    x, y = batch(cfg, dev)
    b = cfg.batch // m
    h, t = x[:b].clone(), y[:b].clone()  # micro-batch 0, its own storage (see pipeline.Shared)
    if not first:
        with torch.no_grad():
            h = run_plan(gpt.blocks, list(range(parts[stage].start)), gpt.embed(h))
    chain, start = mod.chain(t)
    prof = profile(chain, h, start, len(parts[stage]))
    try:
        mod.schedule = make_schedule(cfg.schedule, len(parts[stage]), prof)
    except ValueError as e:
        raise ValueError(f"stage {stage} (blocks {parts[stage].start}..{parts[stage].stop - 1}):"
                         f" {e}") from None
    return mod, prof, gpt


def predicted(cfg: Config, kind: str, stage: int, stages: int, m: int, mod: Stage,
              prof) -> dict:
    """ckptlab's prediction of the stage's peak (pipeline.stage_peak) and, for none and
    every(1), the closed form (pipeline.modeled)."""
    pred = mod.schedule.predict(prof)
    n_fwd = pipeline.n_forward(mod.schedule, prof)
    b = cfg.batch // m
    first, last = stage == 0, stage == stages - 1
    shared = pipeline.shared_views(pred, n_fwd, first, last, 8 * cfg.seq * b,
                                   8 * cfg.seq * cfg.batch)
    order = pipeline.actions(kind, stage, stages, m)
    out = dict(predicted=pipeline.stage_peak(pred, n_fwd, order, shared), modeled=None,
               in_flight=pipeline.in_flight(kind, stage, stages, m), one=pred.peak_bytes)
    recompute = RECOMPUTE.get(cfg.schedule.replace(" ", ""))
    if recompute is not None:
        shape = step_memory.nets_gpt(cfg.layers, cfg.width, cfg.heads, cfg.seq, cfg.vocab)
        dev = next(mod.parameters()).device.type
        out["modeled"] = pipeline.modeled(shape, b, len(mod.blocks), first, last, recompute,
                                          cfg.attn, kind, stage, stages, m, dev)
    return out


def train(rank: int, nproc: int, cfg: Config, kinds=pipeline.SCHEDULES, m: int = 4) -> dict:
    """This rank's stage under each pipeline schedule in `kinds` (a fresh model each): per kind
    its losses, measured peaks per step, prediction, plan and first gradients."""
    with emu.settings(race_check=False):
        return {kind: _train(rank, nproc, cfg, kind, m) for kind in kinds}


def _schedule(kind: str):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    return PipelineStage, {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[kind]


def _train(rank: int, nproc: int, cfg: Config, kind: str, m: int) -> dict:
    dev = cdist.device_of(rank)
    mod, prof, gpt = planned_stage(cfg, rank, nproc, m, dev)
    names = {id(p): n for n, p in gpt.named_parameters()}
    first, last, b = rank == 0, rank == nproc - 1, cfg.batch // m
    # the shapes the stage takes and gives (static metadata: no inference run in a step)
    example_in = (torch.zeros(b, cfg.seq, dtype=torch.long, device=dev) if first else
                  torch.zeros(b, cfg.seq, cfg.width, device=dev, requires_grad=True))
    example_out = torch.zeros(b, cfg.seq, cfg.vocab if last else cfg.width, device=dev,
                              requires_grad=True)
    PipelineStage, Schedule = _schedule(kind)
    stage = PipelineStage(mod, rank, nproc, dev, input_args=example_in, output_args=example_out)
    sched = Schedule(stage, m, loss_fn=loss_fn)
    x, y = batch(cfg, dev)
    opt = torch.optim.SGD(mod.parameters(), lr=cfg.lr)
    losses, peaks, grads = [], [], {}
    for step in range(cfg.steps):
        opt.zero_grad(set_to_none=True)
        led, mb = TorchLedger(mod.parameters()), []
        with led:
            args = (x,) if first else ()
            kw = dict(target=y, losses=mb) if last else {}
            sched.step(*args, **kw)
        peaks.append(led.peak)
        if step == 0:
            grads = {names[id(p)]: p.grad.detach().cpu().clone() for p in mod.parameters()}
        loss = torch.tensor(sum(float(v.detach()) for v in mb) / m if last else 0.0,
                            dtype=torch.float64, device=dev)
        dist.broadcast(loss, src=nproc - 1)
        losses.append(float(loss))
        opt.step()
    return dict(rank=rank, kind=kind, losses=losses, peaks=peaks, plan=str(mod.schedule.plan),
                blocks=list(pipeline.split_layers(cfg.layers, nproc)[rank]), grads=grads,
                **predicted(cfg, kind, rank, nproc, m, mod, prof))


def reference(cfg: Config) -> dict:
    """One process on the whole batch, no pipeline, nothing recomputed: losses, first grads."""
    with emu.settings(race_check=False):
        gpt = _gpt(cfg, torch.device("cpu"))
        x, y = batch(cfg, torch.device("cpu"))
        opt = torch.optim.SGD(gpt.parameters(), lr=cfg.lr)
        losses, grads = [], {}
        for step in range(cfg.steps):
            opt.zero_grad(set_to_none=True)
            loss = gpt(x, y)
            loss.backward()
            if step == 0:
                grads = {n: p.grad.detach().clone() for n, p in gpt.named_parameters()}
            losses.append(float(loss.detach()))
            opt.step()
        return dict(losses=losses, grads=grads)


def run(nproc: int = 2, cfg: Config | None = None, kinds=pipeline.SCHEDULES,
        microbatches: int = 4) -> dict:
    """nproc ranks (new processes), one stage each, under each schedule; then the reference.
    ValueError, before any process starts, for what torch's schedules would refuse inside one:
    fewer blocks than stages, unequal micro-batches, 1F1B with fewer micro-batches than
    stages."""
    cfg = cfg or Config()
    pipeline.split_layers(cfg.layers, nproc)
    for kind in kinds:
        pipeline.actions(kind, 0, nproc, microbatches)
    if cfg.batch % microbatches:
        raise ValueError(f"batch {cfg.batch} must be divisible by microbatches {microbatches}")
    if "1f1b" in kinds and microbatches < nproc:
        raise ValueError(f"1F1B needs a micro-batch a stage at least: {microbatches} < {nproc}")
    ranks = cdist.spawn(train, nproc, cfg, tuple(kinds), microbatches)
    return dict(nproc=nproc, config=asdict(cfg), kinds=list(kinds), microbatches=microbatches,
                ranks=ranks, backend=cdist.backend(nproc), reference=reference(cfg))


def grad_diff(r: dict, ref: dict) -> float:
    """Relative Frobenius difference of a stage's first gradients from one process's."""
    num = sum(float((g.double() - ref["grads"][n].double()).norm()) ** 2
              for n, g in r["grads"].items())
    den = sum(float(ref["grads"][n].double().norm()) ** 2 for n in r["grads"])
    return math.sqrt(num / den) if den else math.sqrt(num)


def check(result: dict) -> list:
    """What disagrees: a stage's saved peak off the prediction (or the closed form), its first
    gradients or the losses off one process."""
    bad, ref = [], result["reference"]
    for kind in result["kinds"]:
        who = pipeline.NAMES[kind]
        for r in (ranks[kind] for ranks in result["ranks"]):
            bad += [f"{who} stage {r['rank']} step {k}: saved {p} bytes, predicted "
                    f"{r['predicted']}" for k, p in enumerate(r["peaks"]) if p != r["predicted"]]
            if r["modeled"] is not None and r["modeled"] != r["predicted"]:
                bad.append(f"{who} stage {r['rank']}: modeled {r['modeled']} bytes, predicted "
                           f"{r['predicted']}")
            diff = grad_diff(r, ref)
            if not diff <= TOLERANCE:
                bad.append(f"{who} stage {r['rank']}: gradients off one process's by "
                           f"{diff:.1e} relative")
        bad += loss_mismatches(result["ranks"][-1][kind]["losses"], ref["losses"],
                               f"under {who}")
    return bad


def report(result: dict) -> str:
    cfg, ref, m = result["config"], result["reference"], result["microbatches"]
    lines = [f"torch.distributed.pipelining over {result['backend']}, {result['nproc']} stages "
             f"(one a rank), {m} micro-batches of {cfg['batch'] // m} sequences; GPT "
             f"L={cfg['layers']} C={cfg['width']} heads={cfg['heads']} N={cfg['seq']}, "
             f"{cfg['attn']} attention, schedule {cfg['schedule']} inside each stage",
             f"{'pipeline':<8} {'stage':>5} {'blocks':>7} {'plan':<22} {'in flight':>9} "
             f"{'saved peak':>11} {'predicted':>10} {'modeled':>9} {'grads diff':>10}"]
    for kind in result["kinds"]:
        for r in (ranks[kind] for ranks in result["ranks"]):
            blocks = f"{r['blocks'][0]}-{r['blocks'][-1]}"
            modeled = f"{r['modeled']:,}" if r["modeled"] is not None else "-"
            lines.append(f"{pipeline.NAMES[kind]:<8} {r['rank']:>5} {blocks:>7} "
                         f"{r['plan']:<22} {r['in_flight']:>9} {max(r['peaks']):>11,} "
                         f"{r['predicted']:>10,} {modeled:>9} {grad_diff(r, ref):>10.1e}")
    lines.append("(plan: the stage's blocks numbered from 0; bytes: saved peak measured by "
                 "storage, TorchLedger; predicted by ckptlab from each stage's profile; modeled "
                 "in closed form, none and every(1) only)")
    head = "".join(f" {'loss, ' + pipeline.NAMES[k]:>14}" for k in result["kinds"])
    lines.append(f"{'step':>4}{head} {'loss, 1 process':>16}")
    for k, want in enumerate(ref["losses"]):
        got = "".join(f" {result['ranks'][-1][kind]['losses'][k]:>14.8f}"
                      for kind in result["kinds"])
        lines.append(f"{k:>4}{got} {want:>16.8f}")
    bad = check(result)
    lines.append(f"all equal (saved bytes exactly, losses and gradients within a relative "
                 f"{TOLERANCE:g})" if not bad else "MISMATCH: " + "; ".join(bad))
    return "\n".join(lines)


def plans(cfg: Config, nproc: int, m: int) -> list:
    """Every stage's schedule, planned here as the ranks will: ValueError naming the stage
    whose blocks the schedule does not fit (the demo's option check)."""
    with emu.settings(race_check=False):
        return [planned_stage(cfg, i, nproc, m, torch.device("cpu"))[0].schedule
                for i in range(nproc)]


def torchrun(cfg: Config, kinds, m: int) -> int:
    """Under torchrun: every rank runs its stage, rank 0 gathers, runs the reference, reports."""
    rank, world = cdist.init_from_env()
    try:
        mine = train(rank, world, cfg, tuple(kinds), m)
        ranks = [None] * world
        dist.all_gather_object(ranks, mine)
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return 0
    result = dict(nproc=world, config=asdict(cfg), kinds=list(kinds), microbatches=m,
                  ranks=ranks, backend=cdist.backend(world), reference=reference(cfg))
    print(report(result))
    return 1 if check(result) else 0


def main(nproc: int, cfg: Config, kinds, m: int) -> int:
    """The demo's --pipeline mode: spawn nproc ranks (or join torchrun's), report, exit status."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return torchrun(cfg, kinds, m)
    result = run(nproc, cfg, kinds, m)
    print(report(result))
    return 1 if check(result) else 0
