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


def one_rank_result(cfg, optimizer="adam"):
    return dict(nproc=1, config=cfg.__dict__, ranks=[fsdp.train(0, 1, cfg, True, optimizer)])


@pytest.mark.parametrize("attn", ["flash", "math"])
@pytest.mark.parametrize("schedule", ["every(1)", "none"])
def test_the_activations_term_is_exact_for_the_attention_run(one_rank, attn, schedule):
    """At L=3 C=48 heads=3 N=24 and 3 sequences a rank, step_memory's standard attention
    predicts 271,488 bytes under every(1): flash keeps O and L where it keeps P, and 265,440
    are held. The table's activations are gpt_bytes', exact for both kinds."""
    cfg = demo.Config(steps=1, layers=3, width=48, heads=3, seq=24, batch=3, vocab=32,
                      attn=attn, schedule=schedule)
    result = one_rank_result(cfg)
    want, got = fsdp.predicted(result), fsdp.measured(result["ranks"][0])
    assert want["activations"] == got["activations"] == result["ranks"][0]["predicted"]
    for term in ("logits", "unit"):
        assert want[term] == got[term], term
    if (attn, schedule) == ("flash", "every(1)"):
        assert got["activations"] == 265_440


def test_the_prediction_takes_each_ranks_slice_of_the_batch():
    """predicted() of a 2-rank run at global batch 6 is the 1-rank prediction at batch 3 in
    every per-rank term but the sharded states (a model of the global batch would double the
    activations and the logits)."""
    def terms(n, batch):
        cfg = dict(CFG.__dict__, batch=batch, schedule="every(1)", attn="flash")
        return fsdp.predicted(dict(config=cfg, nproc=n, ranks=[dict(optimizer_name="adam")]))
    two, one = terms(2, 6), terms(1, 3)
    for term in ("activations", "logits", "unit"):
        assert two[term] == one[term], term
    assert two["logits"] == 4 * CFG.seq * 3 * CFG.vocab
    assert two["params"] == -(-one["params"] // 2)


def test_bad_optimizer_is_one_clear_error():
    with pytest.raises(ValueError, match="optimizer: expected one of"):
        fsdp.train(0, 1, CFG, shard=False, optimizer="lion")


@pytest.fixture(scope="module", params=[2, 4])
def result(request):
    return fsdp.run(request.param, demo.Config(**{**CFG.__dict__, "schedule": "every(1)"}),
                    optimizer="adam")


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
    # the memory table, term by term: exact but where the padding of the shards explains it
    rows = {r["term"]: r for r in fsdp.step_memory.compare(fsdp.predicted(result),
                                                           fsdp.measured(result["ranks"][0]))}
    assert set(rows) == {"params", "grads", "optimizer", "activations", "unit", "logits"}
    for term in ("activations", "unit", "logits"):
        assert rows[term]["predicted"] == rows[term]["measured"], term
    for term in ("params", "grads", "optimizer"):
        assert abs(rows[term]["rel"]) <= 0.02, term
