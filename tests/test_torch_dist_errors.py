"""ckptlab.torch.dist.spawn when a rank fails: its exception comes back to the caller with its
message, and the ranks still waiting on it in a collective are stopped, not left to hang."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")
pytestmark = pytest.mark.torch


def _rank_one_fails(rank, nproc):
    import torch.distributed as dist

    if rank == 1:
        raise ValueError("rank 1 could not go on")
    dist.barrier()  # rank 0 waits for a peer that never comes
    return rank


def _all_return(rank, nproc):
    import torch.distributed as dist

    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return float(t)


def test_a_failing_rank_is_reported_and_the_others_stopped():
    from torch.multiprocessing import ProcessRaisedException

    from ckptlab.torch import dist

    with pytest.raises(ProcessRaisedException, match="rank 1 could not go on"):
        dist.spawn(_rank_one_fails, 2)


def test_every_rank_returns_after_the_barrier():
    from ckptlab.torch import dist

    assert dist.spawn(_all_return, 3) == [3.0, 3.0, 3.0]
