"""The small Llama (ckptlab.torch.llama) on several processes (gloo on CPUs), each rank's saved
bytes measured against ckptlab's prediction (ckptlab.torch.llama_bytes):

    fsdp_run(2, cfg, batch=4)            # FSDP2: every block and the model a fully_shard unit
    pipeline_run(3, cfg, batch=8, m=4)   # torch.distributed.pipelining, 1F1B, a stage a rank

Under FSDP2 each rank runs its slice of the batch; the parameters a layer saves are the
all-gathered ones, FSDP's and not activations (ckptlab.torch.fsdp's ledger leaves them out).
In the pipeline every rank builds the whole model from one seed and keeps its stage, its
blocks split as the planner splits layers (ckptlab.cluster.pipeline.split_layers: unevenly when
the stages do not divide them, the first and last lighter), and holds min(p - i, m)
micro-batches at once under 1F1B (Schedule1F1B).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ckptlab.torch import dist as cdist
from ckptlab.torch import llama_bytes
from ckptlab.torch import pipeline as torch_pipeline
from ckptlab.torch.fsdp import _ActivationLedger
from ckptlab.torch.ledger import TorchLedger
from ckptlab.torch.llama import Llama


def batch_of(cfg, batch: int):
    """The inputs and next-token targets of one step, each its own storage."""
    g = torch.Generator().manual_seed(cfg.seed + 1)
    tokens = torch.randint(0, cfg.vocab, (batch, cfg.seq + 1), generator=g)
    return tokens[:, :-1].clone(), tokens[:, 1:].clone()


def _fsdp_rank(rank: int, nproc: int, cfg, batch: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    x, y = batch_of(cfg, batch)
    n = batch // nproc
    x, y = x[rank * n:(rank + 1) * n].clone(), y[rank * n:(rank + 1) * n].clone()
    model = Llama(cfg)
    mesh = init_device_mesh("cpu", (nproc,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    led = _ActivationLedger(model)
    with led:
        loss = model(x, y)
        loss.backward()
    return dict(rank=rank, saved=led.peak, loss=float(loss.detach()),
                predicted=llama_bytes.stage_bytes(cfg, n, model.blocks, True, True))


def fsdp_run(nproc: int, cfg, batch: int) -> list:
    if batch % nproc:
        raise ValueError(f"batch {batch} must be divisible by the {nproc} ranks")
    return cdist.spawn(_fsdp_rank, nproc, cfg, batch)


class Stage(nn.Module):
    """Blocks `blocks` of a Llama, with the embedding if first, the final norm and output
    projection (the logits) if last."""

    def __init__(self, model: Llama, blocks: range, first: bool, last: bool):
        super().__init__()
        self.model, self.first, self.last = model, first, last
        self.blocks = nn.ModuleList(model.blocks[i] for i in blocks)

    def forward(self, x):
        if self.first:
            x = self.model.embed(x)
        for blk in self.blocks:
            x = blk(x, *self.model._rope(x))
        return self.model.output(self.model.norm(x)) if self.last else x


def _loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _pipeline_rank(rank: int, nproc: int, cfg, batch: int, m: int) -> dict:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    blocks = torch_pipeline.split_layers(cfg.layers, nproc)[rank]
    first, last, b = rank == 0, rank == nproc - 1, batch // m
    model = Llama(cfg)
    stage_mod = Stage(model, blocks, first, last)
    ex_in = (torch.zeros(b, cfg.seq, dtype=torch.long) if first else
             torch.zeros(b, cfg.seq, cfg.width, requires_grad=True))
    ex_out = torch.zeros(b, cfg.seq, cfg.vocab if last else cfg.width, requires_grad=True)
    stage = PipelineStage(stage_mod, rank, nproc, torch.device("cpu"), input_args=ex_in,
                          output_args=ex_out)
    sched = Schedule1F1B(stage, m, loss_fn=_loss)
    x, y = batch_of(cfg, batch)
    led = TorchLedger(stage_mod.parameters())
    with led:
        sched.step(*((x,) if first else ()), **(dict(target=y) if last else {}))
    held = torch_pipeline.in_flight("1f1b", rank, nproc, m)
    return dict(rank=rank, blocks=list(blocks), saved=led.peak, in_flight=held,
                predicted=llama_bytes.stage_bytes(cfg, b, blocks, first, last, held, batch))


def pipeline_run(nproc: int, cfg, batch: int, m: int) -> list:
    torch_pipeline.split_layers(cfg.layers, nproc)
    if batch % m or m < nproc:
        raise ValueError(f"batch {batch} must split into m = {m} micro-batches, m >= {nproc}")
    return cdist.spawn(_pipeline_rank, nproc, cfg, batch, m)


def one_process(cfg, batch: int) -> dict:
    """The whole model on one process: saved peak measured and predicted."""
    x, y = batch_of(cfg, batch)
    model = Llama(cfg)
    led = TorchLedger(model.parameters())
    with led:
        model(x, y).backward()
    return dict(saved=led.peak,
                predicted=llama_bytes.stage_bytes(cfg, batch, model.blocks, True, True))

