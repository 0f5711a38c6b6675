"""FSDP2 with a ckptlab schedule (ckptlab.torch.fsdp): a small GPT whose blocks are each an
FSDP unit and are planned by ckptlab. One rank in this process (cheap): the saved bytes equal
ckptlab's prediction with the all-gathered parameters left out, the losses equal the model
without FSDP. Two and four spawned gloo ranks (slow): each rank's saved bytes equal the
prediction for its slice, the losses equal one process within demo.TOLERANCE, and each rank
stores 1/n of the parameters, gradients and Adam state (counted by storage)."""

import math
import tempfile

import pytest

dist = pytest.importorskip("torch.distributed")  # PyTorch missing: this module is skipped

from ckptlab.torch import demo, fsdp, nets  # noqa: E402

CFG = demo.Config(steps=2, layers=3, width=32, heads=2, seq=17, batch=4, vocab=32,
                  attn="math", schedule="optimal(40%)")


def padded_bytes(model_cfg, n: int) -> int:
    """Bytes of one rank's parameter shards: FSDP2 pads dim 0 to a multiple of n rows."""
    m = nets.GPT(vocab=model_cfg.vocab, ctx=model_cfg.seq, width=model_cfg.width,
                 heads=model_cfg.heads, layers=model_cfg.layers, attn=model_cfg.attn)
    return sum(math.ceil(p.shape[0] / n) * (p.numel() // p.shape[0]) * 4
               for p in m.parameters())


@pytest.fixture
def one_rank():
    """A one-rank gloo group in this process, destroyed afterwards."""
    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group("gloo", init_method=f"file://{folder}/rdv", rank=0,
                                world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def test_one_rank_fsdp_holds_what_ckptlab_predicts(one_rank):
    cfg = demo.Config(**{**CFG.__dict__, "layers": 2, "seq": 9, "batch": 2,
                                "schedule": "optimal(60%)", "steps": 1})
    got = fsdp.train(0, 1, cfg, shard=True, optimizer="adam")
    ref = fsdp.train(0, 1, cfg, shard=False, optimizer="adam")
    assert got["saved"] == [got["predicted"]] * cfg.steps == ref["saved"]
    assert got["plan"] != str(list(range(cfg.layers)))  # something is checkpointed
    for a, b in zip(got["losses"], ref["losses"], strict=True):
        assert abs(a - b) <= demo.TOLERANCE * abs(b)
    assert got["params"] == ref["params"] == 4 * ref["n_params"]
    assert got["grads"] == [got["params"]] * cfg.steps
    # Adam: exp_avg and exp_avg_sq per parameter, plus a 4-byte step per parameter tensor
    n_tensors = 5 + 16 * cfg.layers  # wte, wpe; the head's LayerNorm (2) and out; 16 a block
    assert got["optimizer"] == 2 * got["params"] + 4 * n_tensors


def test_bad_optimizer_is_one_clear_error():
    with pytest.raises(ValueError, match="optimizer: expected one of"):
        fsdp.train(0, 1, CFG, shard=False, optimizer="lion")


@pytest.fixture(scope="module", params=[2, 4])
def result(request):
    return fsdp.run(request.param, CFG, optimizer="adam")


@pytest.mark.slow
def test_fsdp_ranks_equal_one_process_and_shard_the_state(result):
    n, ref = result["nproc"], result["reference"]
    assert fsdp.check(result) == []
    assert ref["losses"][-1] < ref["losses"][0]  # it trains
    for r in result["ranks"]:
        assert r["saved"] == [r["predicted"]] * CFG.steps
        assert r["params"] == padded_bytes(CFG, n)
        assert r["grads"] == [r["params"]] * CFG.steps
        block = nets.Block(CFG.width, CFG.heads, 0.0, "math")
        assert r["unit"] == 4 * sum(p.numel() for p in block.parameters())  # one block
        # every rank's Adam state is close to 1/n of the whole (the last rank's shard of an
        # uneven parameter has fewer rows; the 4-byte steps are replicated)
        assert abs(r["optimizer"] - ref["optimizer"] / n) <= 0.02 * ref["optimizer"] / n
    # activations: the ranks' slices sum to the whole batch's
    assert result["ranks"][0]["predicted"] < ref["predicted"]
    assert "MISMATCH" not in fsdp.report(result)
