"""The demos at one sequence a rank (--batch = --nproc): each rank's inputs and targets are their
own storages, so the saved bytes measured equal ckptlab's prediction, as at two or more. (With
one row, local[:, :-1] is already contiguous: .contiguous() handed back a view of the whole
batch, which the embeddings and the loss both saved and the ledger counted once, while the
profile counted it in each.)"""

import tempfile

import pytest

dist = pytest.importorskip("torch.distributed")  # PyTorch missing: this module is skipped

from ckptlab.torch import demo, fsdp  # noqa: E402
from ckptlab.torch.ledger import storage_of  # noqa: E402
from ckptlab.torch.training import Config, rank_inputs  # noqa: E402

ONE = Config(steps=1, layers=2, width=32, heads=2, seq=9, batch=2, vocab=32, attn="math",
             schedule="none")


@pytest.mark.parametrize("batch,nproc", [(2, 2), (1, 1), (4, 2)])
def test_each_rank_owns_its_inputs_and_targets(batch, nproc):
    cfg = Config(**{**ONE.__dict__, "batch": batch})
    n = batch // nproc
    for rank in range(nproc):
        x, y = rank_inputs(cfg, rank, nproc, "cpu")
        assert x.shape == y.shape == (n, cfg.seq)
        assert storage_of(x)[0] != storage_of(y)[0]
        assert storage_of(x)[1] == storage_of(y)[1] == 8 * n * cfg.seq


@pytest.mark.parametrize("schedule", ["none", "every(1)", "optimal(60%)"])
def test_ddp_rank_holds_what_ckptlab_predicts_at_one_sequence(schedule):
    cfg = Config(**{**ONE.__dict__, "batch": 1, "schedule": schedule})
    r = demo.train(0, 1, cfg, ddp=False)  # a rank's step, without the process group
    assert r["peaks"] == [r["predicted"]] * cfg.steps


@pytest.fixture
def one_rank():
    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group("gloo", init_method=f"file://{folder}/rdv", rank=0,
                                world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def test_fsdp_rank_holds_what_ckptlab_predicts_at_one_sequence(one_rank):
    cfg = Config(**{**ONE.__dict__, "batch": 1})
    r = fsdp.train(0, 1, cfg, shard=True, optimizer="adam")
    assert r["saved"] == [r["predicted"]] * cfg.steps
    result = dict(nproc=1, config=cfg.__dict__, ranks=[r])
    assert fsdp.predicted(result)["activations"] == fsdp.measured(r)["activations"]


@pytest.mark.slow
def test_two_ranks_of_one_sequence_agree():
    """The demos as run: `--nproc 2 --batch 2`, DDP and FSDP, no MISMATCH."""
    cfg = Config(**{**ONE.__dict__, "steps": 2})
    result = demo.run(2, cfg)
    assert demo.check_ddp(result) == []
    result = fsdp.run(2, cfg, optimizer="adam")
    assert fsdp.check(result) == []
    rows = fsdp.step_memory.compare(fsdp.predicted(result), fsdp.measured(result["ranks"][1]))
    assert [r["predicted"] - r["measured"] for r in rows if r["term"] == "activations"] == [0]
