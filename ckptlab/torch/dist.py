"""More than one process, on PyTorch's own distributed engine.

    results = spawn(fn, nproc, *args)     # fn(rank, nproc, *args) in nproc processes

Each process joins one process group: NCCL when every rank can have its own GPU, else gloo on
the CPU (where ckptlab's kernels run on the emulator); the rendezvous is a file, so no port is
needed. Each rank's return value comes back through torch.save in a temporary folder. Under
torchrun (RANK and WORLD_SIZE set) `init_from_env()` joins the group torchrun describes.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def backend(nproc: int) -> str:
    """"nccl" when there are at least nproc GPUs, else "gloo" (CPU)."""
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= nproc else "gloo"


def device_of(rank: int) -> torch.device:
    """The device a rank computes on: its GPU under NCCL, else the CPU."""
    return torch.device("cuda", rank) if dist.get_backend() == "nccl" else torch.device("cpu")


def _entry(rank: int, fn, nproc: int, folder: str, args: tuple) -> None:
    torch.set_num_threads(1)  # nproc processes share the cores: one BLAS thread each
    dist.init_process_group(backend(nproc), init_method=f"file://{folder}/rendezvous",
                            rank=rank, world_size=nproc)
    # On an exception no barrier and no teardown: the other ranks may be inside a collective with
    # this one, and spawn reports the error and stops them.
    torch.save(fn(rank, nproc, *args), Path(folder) / f"rank{rank}.pt")
    # Every rank done before any closes its connections: a rank that tears its group down while
    # a peer's transport still talks to it can abort that peer ("terminate called without an
    # active exception" from gloo, seen once in a 2-rank pipeline run in CI).
    dist.barrier()
    dist.destroy_process_group()


def spawn(fn, nproc: int, *args) -> list:
    """Run fn(rank, nproc, *args) on ranks 0..nproc-1, each in a new process within one process
    group; returns the ranks' return values in rank order. A rank's exception is raised here
    (torch.multiprocessing.ProcessRaisedException, with its traceback). fn must be importable
    (a module-level function): the processes are started with "spawn"."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc: expected an int >= 1, got {nproc!r}")
    with tempfile.TemporaryDirectory(prefix="ckptlab-dist-") as folder:
        mp.start_processes(_entry, args=(fn, nproc, folder, args), nprocs=nproc, join=True,
                           start_method="spawn")
        return [torch.load(Path(folder) / f"rank{r}.pt", weights_only=False)
                for r in range(nproc)]


def init_from_env() -> tuple:
    """(rank, world size) after joining the group torchrun set up (env:// rendezvous)."""
    world = int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group(backend(world), init_method="env://")
    return dist.get_rank(), world
