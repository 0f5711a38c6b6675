"""A small GPT trained under FSDP2 (ZeRO-3: parameters, gradients and optimizer state sharded
over the ranks), with a ckptlab schedule over its blocks, and what each rank holds, measured.

    result = run(2, Config(...))                  # 2 ranks (gloo on CPUs, NCCL on GPUs)
    python -m ckptlab.torch.demo --fsdp --nproc 4

The structure is the DDP demo's (ckptlab.torch.demo): one global batch, each rank its slice;
each rank profiles its unsharded model on its slice and plans the blocks with the schedule.
Then every block, and the model around them, becomes one FSDP unit
(torch.distributed.fsdp.fully_shard on a one-dimensional device mesh): a rank stores 1/n of
each parameter (a DTensor sharded on dim 0, padded to a multiple of n rows), all-gathers a
unit's parameters before its forward and again before its backward (a checkpointed block's
recompute included), and reduce-scatters the gradients, so that its gradient and optimizer
state are 1/n too. The losses equal one process training on the whole batch up to float32
rounding (training.TOLERANCE).

What each rank reports, every byte counted exactly, by storage:
  saved      the peak of saved-tensor bytes (TorchLedger), all-gathered parameters excluded
             (they are FSDP's, not activations): equal to ckptlab's prediction for the plan;
  params, grads, optimizer   bytes of the local shards' storages (padding included);
  unit       the largest all-gathered unit: the bytes of a unit's unsharded parameters;
  logits     the logits tensor (B, N, V) of the rank's slice.
Not measured: the CPU allocator's peak (PyTorch's CPU allocator reports none), temporaries
inside an op, and FSDP's communication buffers (all-gather input and reduce-scatter output).
"""

from __future__ import annotations

import os
from dataclasses import asdict

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from ckptlab import emu
from ckptlab.cluster import step_memory
from ckptlab.torch import dist as cdist
from ckptlab.torch import gpt_bytes
from ckptlab.torch.ledger import TorchLedger, storage_of
from ckptlab.torch.training import (
    TOLERANCE,
    Config,
    loss_mismatches,
    loss_table,
    rank_inputs,
    scheduled_gpt,
)

OPTIMIZERS = ("sgd", "adam")
ADAM_LR = 1e-3  # Adam's default step size (Kingma & Ba 2015, Algorithm 1; torch.optim.Adam's)


class _ActivationLedger(TorchLedger):
    """A TorchLedger that never counts a tensor whose storage is a module parameter's now:
    under FSDP the parameters a layer saves are the all-gathered (unsharded) ones, swapped into
    the modules during their forward, which the ledger's fixed parameter set cannot know."""

    def __init__(self, model):
        super().__init__(_local(p) for p in model.parameters())
        self._model = model

    def acquire(self, t, holder) -> None:
        if storage_of(t)[0] in {storage_of(_local(p))[0] for p in self._model.parameters()}:
            return
        super().acquire(t, holder)


def _local(t) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind the tensors' local parts."""
    seen = {}
    for t in tensors:
        key, nbytes = storage_of(_local(t))
        seen[key] = nbytes
    return sum(seen.values())


def _optimizer_bytes(opt) -> int:
    return _storage_bytes(v for state in opt.state.values() for v in state.values()
                          if isinstance(v, torch.Tensor))


def _units(model) -> list:
    return [*model.blocks, model]


def _watch_units(model, seen: list) -> list:
    """Forward pre-hooks (after FSDP's, which all-gather) recording the bytes of each block's
    unsharded parameters (storages of the local tensors, so a padded all-gather counts whole)."""
    def hook(module, args):
        seen.append(_storage_bytes(module.parameters(recurse=True)))
    return [b.register_forward_pre_hook(hook) for b in model.blocks]


def train(rank: int, nproc: int, cfg: Config, shard: bool = True,
          optimizer: str = "sgd") -> dict:
    """This rank's part: losses averaged over the ranks, measured bytes per step, ckptlab's
    prediction of its saved bytes. shard=False: one process, no FSDP (the reference)."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer: expected one of {OPTIMIZERS}, got {optimizer!r}")
    with emu.settings(race_check=False):
        return _train(rank, nproc, cfg, shard, optimizer)


def _train(rank: int, nproc: int, cfg: Config, shard: bool, optimizer: str) -> dict:
    dev = cdist.device_of(rank) if shard else torch.device("cpu")
    x, y = rank_inputs(cfg, rank, nproc, dev)
    model, predicted = scheduled_gpt(cfg, dev, x, y)
    n_params = sum(p.numel() for p in model.parameters())
    if shard:
        mesh = init_device_mesh(dev.type, (nproc,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = (torch.optim.SGD(model.parameters(), lr=cfg.lr) if optimizer == "sgd" else
           torch.optim.Adam(model.parameters(), lr=ADAM_LR))
    logits = []
    model.head.out.register_forward_hook(lambda m, i, o: logits.append(storage_of(o)[1]))
    losses, saved, grads, units = [], [], [], []
    hooks = _watch_units(model, units)
    for _ in range(cfg.steps):
        opt.zero_grad(set_to_none=True)
        led = _ActivationLedger(model)
        with led:
            loss = model(x, y)
            loss.backward()
        saved.append(led.peak)
        grads.append(_storage_bytes(p.grad for p in model.parameters() if p.grad is not None))
        total = loss.detach().clone()
        if shard:
            dist.all_reduce(total)
        losses.append(float(total) / (nproc if shard else 1))
        opt.step()
    for h in hooks:
        h.remove()
    return dict(rank=rank, losses=losses, saved=saved, predicted=predicted,
                plan=str(model.schedule.plan), device=str(dev), n_params=n_params,
                params=_storage_bytes(model.parameters()), grads=grads,
                optimizer=_optimizer_bytes(opt), unit=max(units), logits=max(logits),
                optimizer_name=optimizer)


def run(nproc: int = 2, cfg: Config | None = None, optimizer: str = "sgd") -> dict:
    """nproc ranks (new processes) under FSDP, then the one-process reference here."""
    cfg = cfg or Config()
    ranks = cdist.spawn(train, nproc, cfg, True, optimizer)
    return dict(nproc=nproc, config=asdict(cfg), ranks=ranks, backend=cdist.backend(nproc),
                reference=train(0, 1, cfg, shard=False, optimizer=optimizer))


def torchrun(cfg: Config, optimizer: str = "adam") -> int:
    """Under torchrun: every rank trains, rank 0 gathers, runs the reference and reports."""
    rank, world = cdist.init_from_env()
    try:
        mine = train(rank, world, cfg, True, optimizer)
        ranks = [None] * world
        dist.all_gather_object(ranks, mine)
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return 0
    result = dict(nproc=world, config=asdict(cfg), ranks=ranks, backend=cdist.backend(world),
                  reference=train(0, 1, cfg, shard=False, optimizer=optimizer))
    print(report(result))
    return 1 if check(result) else 0


def main(nproc: int, cfg: Config, optimizer: str = "adam") -> int:
    """The demo's --fsdp mode: spawn nproc ranks (or join torchrun's), report, exit status."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return torchrun(cfg, optimizer)
    result = run(nproc, cfg, optimizer)
    print(report(result))
    return 1 if check(result) else 0


def predicted(result: dict) -> dict:
    """ckptlab.cluster.step_memory's terms for one rank of this run (fp32, no dropout, the
    LayerNorms' statistics counted), its slice of the batch; the activations for the schedules
    the model knows ("none": nothing recomputed, every(1): each block checkpointed, i.e.
    Korthikanti's full), with the attention the model runs (gpt_bytes: flash keeps O and L
    where the standard attention keeps P)."""
    cfg, n = result["config"], result["nproc"]
    shape = step_memory.nets_gpt(cfg["layers"], cfg["width"], cfg["heads"], cfg["seq"],
                                 cfg["vocab"])
    layout = step_memory.Layout(dp=n, zero=3, micro_batch=cfg["batch"] // n)
    recompute = {"none": "none", "every(1)": "full"}.get(cfg["schedule"].replace(" ", ""))
    m = step_memory.step_memory(shape, layout, "fp32", recompute or "none",
                                result["ranks"][0]["optimizer_name"], dropout=False,
                                ln_stats=True)
    out = dict(m.terms, unit=shape.layer_params() * 4,
               logits=4 * cfg["seq"] * layout.micro_batch * cfg["vocab"])
    del out["activations"]  # step_memory's assumes the standard attention: gpt_bytes' instead
    if recompute is not None:
        device = result["ranks"][0].get("device", "cpu").split(":")[0]
        acts = gpt_bytes.stage_bytes(shape, layout.micro_batch, cfg["layers"], True, True,
                                     recompute, cfg["attn"], device=device)
        if acts is not None:
            out["activations"] = acts
    return out


WHY = {
    "params": "FSDP pads each parameter's dim 0 to a multiple of the ranks",
    "grads": "the gradients' shards are the parameters' (padded the same)",
    "optimizer": "Adam's step count: one fp32 scalar per parameter tensor, on every rank; "
                 "the state follows the unpadded shards",
}


def measured(rank: dict) -> dict:
    """One rank's measured terms, named as predicted()'s."""
    return dict(params=rank["params"], grads=max(rank["grads"]), optimizer=rank["optimizer"],
                activations=max(rank["saved"]), unit=rank["unit"], logits=rank["logits"])


def memory_table(result: dict) -> str:
    """Prediction vs measurement per term, for every rank."""
    lines = [f"{'rank':>4}  {'term':<12} {'predicted':>10} {'measured':>10} {'diff':>7}  why"]
    pred = predicted(result)
    for r in result["ranks"]:
        for row in step_memory.compare(pred, measured(r), WHY):
            why = row["why"] if row["predicted"] != row["measured"] else ""
            lines.append(f"{r['rank']:>4}  {row['term']:<12} {row['predicted']:>10,} "
                         f"{row['measured']:>10,} {row['rel']:>+7.2%}  {why}")
    return "\n".join(lines)


def check(result: dict) -> list:
    """What disagrees: a rank's saved bytes off the prediction, a loss off one process."""
    bad = []
    for r in result["ranks"]:
        bad += [f"rank {r['rank']} step {k}: saved {p} bytes, predicted {r['predicted']}"
                for k, p in enumerate(r["saved"]) if p != r["predicted"]]
    for r in result["ranks"]:
        bad += loss_mismatches(r["losses"], result["reference"]["losses"],
                               f"on rank {r['rank']} under FSDP")
    return bad


def report(result: dict) -> str:
    cfg, ref = result["config"], result["reference"]
    lines = [f"FSDP2 (fully_shard per block) over {result['backend']}, {result['nproc']} ranks "
             f"({result['ranks'][0]['device']}); GPT L={cfg['layers']} C={cfg['width']} "
             f"heads={cfg['heads']} N={cfg['seq']}, global batch {cfg['batch']}, "
             f"{cfg['attn']} attention, schedule {cfg['schedule']}, "
             f"{result['ranks'][0]['optimizer_name']}",
             f"{'rank':>4}  {'plan':<24} {'saved peak':>11} {'predicted':>10} {'params':>9} "
             f"{'grads':>9} {'optimizer':>9} {'unit':>9}  (bytes, measured by storage)"]
    for r in result["ranks"]:
        lines.append(f"{r['rank']:>4}  {r['plan']:<24} {max(r['saved']):>11,} "
                     f"{r['predicted']:>10,} {r['params']:>9,} {max(r['grads']):>9,} "
                     f"{r['optimizer']:>9,} {r['unit']:>9,}")
    lines.append(f"one process: params {ref['params']:,}, grads {max(ref['grads']):,}, "
                 f"optimizer {ref['optimizer']:,}, saved peak {max(ref['saved']):,} bytes")
    lines += loss_table(result["ranks"][0]["losses"], ref["losses"], "FSDP")
    bad = check(result)
    lines.append("all equal (saved bytes exactly, losses within a relative "
                 f"{TOLERANCE:g})" if not bad else "MISMATCH: " + "; ".join(bad))
    lines += ["", "bytes per rank, modeled (ckptlab.cluster.step_memory; the activations with "
              "the attention run, ckptlab.torch.gpt_bytes) vs measured by storage:",
              memory_table(result)]
    return "\n".join(lines)
