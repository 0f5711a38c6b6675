"""Pipeline parallelism on PyTorch's own engine (ckptlab.torch.pipeline, pipelined): the order in
which a stage runs its micro-batches under GPipe and 1F1B, worked by hand; the peak of a stage's
saved bytes from ckptlab's per-micro-batch prediction, on a prediction small enough to add up on
paper; the closed form (gpt_bytes) against that prediction for every stage of 2- and 4-stage
pipelines; one stage in this process under torch.distributed.pipelining (GPipe holds every
micro-batch, 1F1B one), measured bytes equal to both; and (slow: processes) 2 and 4 gloo ranks,
each stage's bytes equal to the prediction, losses and gradients to one process."""

import tempfile

import pytest

dist = pytest.importorskip("torch.distributed")  # PyTorch missing: this module is skipped

from ckptlab.recompute.schedules import Prediction  # noqa: E402
from ckptlab.torch import pipeline, pipelined  # noqa: E402
from ckptlab.torch.training import TOLERANCE, Config  # noqa: E402

TINY = Config(steps=2, layers=2, seq=9, batch=4, vocab=16, width=16, heads=2, attn="flash",
              schedule="every(1)")


def test_layers_split_evenly_the_first_stages_taking_the_rest():
    assert pipeline.split_layers(8, 4) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    assert pipeline.split_layers(5, 3) == [range(0, 2), range(2, 4), range(4, 5)]
    assert pipeline.split_layers(3, 1) == [range(0, 3)]
    with pytest.raises(ValueError, match="2 layers cannot fill 3 stages"):
        pipeline.split_layers(2, 3)
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="stages: expected an int >= 1"):
            pipeline.split_layers(4, bad)


def test_the_orders_are_torchs():
    """GPipe: every forward, then every backward. 1F1B (torch's Schedule1F1B): stage i of p
    runs min(m, p - i) forwards, then one backward and one forward while forwards are left."""
    F, B = "F", "B"
    assert pipeline.actions("gpipe", 1, 2, 3) == [(F, 0), (F, 1), (F, 2), (B, 0), (B, 1), (B, 2)]
    assert pipeline.actions("1f1b", 1, 4, 6) == [(F, 0), (F, 1), (F, 2), (B, 0), (F, 3), (B, 1),
                                                 (F, 4), (B, 2), (F, 5), (B, 3), (B, 4), (B, 5)]
    assert pipeline.actions("1f1b", 3, 4, 3) == [(F, 0), (B, 0), (F, 1), (B, 1), (F, 2), (B, 2)]
    for p, m in ((2, 4), (4, 4), (4, 8), (3, 7)):
        for i in range(p):
            assert pipeline.in_flight("gpipe", i, p, m) == m
            assert pipeline.in_flight("1f1b", i, p, m) == p - i
    assert pipeline.in_flight("1f1b", 0, 4, 2) == 2  # fewer micro-batches than stages
    with pytest.raises(ValueError, match="pipeline schedule: expected one of"):
        pipeline.actions("interleaved", 0, 2, 4)
    with pytest.raises(ValueError, match=r"stage: expected an int in \[0, 2\)"):
        pipeline.actions("gpipe", 2, 2, 4)


def toy_prediction():
    """One micro-batch: forward holds 2 then 5 bytes, backward 3 then nothing."""
    pred = Prediction(steps=[("F", 0, 2), ("F", 1, 5), ("B", 1, 3), ("B", 0, 0)])
    pred.peak_bytes = 5
    return pred


def test_micro_batches_side_by_side_by_hand():
    pred = toy_prediction()
    gpipe = pipeline.actions("gpipe", 0, 1, 2)  # F0 F1 B0 B1: 2, 5, 7, 10, 8, 5, 3, 0
    assert pipeline.stage_peak(pred, 2, gpipe) == 10
    assert pipeline.stage_peak(pred, 2, pipeline.actions("1f1b", 0, 1, 2)) == 5
    # a 1-byte slice of a 3-byte storage, saved at steps 0..2: 10 - 2 slices + 3 once
    ids = pipeline.Shared(own=1, whole=3, steps=range(0, 3))
    assert pipeline.stage_peak(pred, 2, gpipe, [ids]) == 11
    # held at step 1 only (the targets): at 5 + 5 both hold it, 10 - 2 + 3
    assert pipeline.stage_peak(pred, 2, gpipe, [pipeline.Shared(1, 3, range(1, 2))]) == 11
    # one micro-batch alone: 5 - 1 + 3
    assert pipeline.stage_peak(pred, 2, [("F", 0), ("B", 0)], [ids]) == 7


def test_stage_peak_refuses_a_prediction_that_does_not_end_empty():
    pred = toy_prediction()
    pred.steps[-1] = ("B", 0, 1)
    with pytest.raises(ValueError, match="end with nothing held"):
        pipeline.stage_peak(pred, 2, [("F", 0), ("B", 0)])


def test_shared_views_hold_ids_until_the_last_step_and_targets_for_one():
    """Six steps, three of them the forward (embeddings, a block, the head with its loss): the
    token ids are saved by the first step and released by the last (held after steps 0..4);
    the targets are saved by the head's forward (step 2) and released by its backward, the
    very next step (held after step 2 only)."""
    pred = Prediction(steps=[("F", 0, 1)] * 3 + [("B", 0, 1)] * 2 + [("B", 0, 0)])
    first, last = pipeline.shared_views(pred, 3, True, True, ids=8, whole=32)
    assert (first.own, first.whole, list(first.steps)) == (8, 32, [0, 1, 2, 3, 4])
    assert (last.own, last.whole, list(last.steps)) == (8, 32, [2])
    assert pipeline.shared_views(pred, 3, False, False, 8, 32) == []
    (only,) = pipeline.shared_views(pred, 3, False, True, 8, 32)
    assert list(only.steps) == [2]


@pytest.mark.parametrize("attn,schedule", [
    ("flash", "every(1)"), ("math", "none"),
    pytest.param("flash", "none", marks=pytest.mark.slow),
    pytest.param("math", "every(1)", marks=pytest.mark.slow)])
def test_closed_form_equals_the_prediction_on_every_stage(attn, schedule):
    """pipeline.modeled (gpt_bytes) against stage_peak on each stage's own profile: 4 stages
    (the first, two in the middle, the last), both pipeline schedules, micro-batches of one,
    two and eight sequences; 2 stages as well where the test is slow."""
    cfg = Config(**{**TINY.__dict__, "layers": 4, "batch": 8, "attn": attn,
                    "schedule": schedule})
    slow = (attn, schedule) not in (("flash", "every(1)"), ("math", "none"))
    for p in (2, 4) if slow else (4,):
        for m in (1, 4, 8):  # the whole batch as one micro-batch, two sequences, one
            for i in range(p):
                mod, prof, _ = pipelined.planned_stage(cfg, i, p, m, "cpu")
                for kind in pipeline.SCHEDULES:
                    got = pipelined.predicted(cfg, kind, i, p, m, mod, prof)
                    assert got["modeled"] == got["predicted"], (p, m, i, kind)
                    assert got["in_flight"] == (m if kind == "gpipe" else min(m, p - i))


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


def one_stage(cfg, m):
    ranks = [pipelined.train(0, 1, cfg, pipeline.SCHEDULES, m)]
    return dict(nproc=1, config=cfg.__dict__, kinds=list(pipeline.SCHEDULES), microbatches=m,
                ranks=ranks, backend="gloo", reference=pipelined.reference(cfg))


@pytest.mark.parametrize("schedule,attn", [
    ("every(1)", "math"), pytest.param("optimal(70%)", "flash", marks=pytest.mark.slow)])
def test_one_stage_holds_what_ckptlab_predicts(one_rank, schedule, attn):
    """One stage is the whole model (its token ids and targets both views of the batch): GPipe
    holds all 4 micro-batches (of one sequence), 1F1B one; measured = predicted exactly."""
    cfg = Config(**{**TINY.__dict__, "schedule": schedule, "attn": attn})
    result = one_stage(cfg, 4)
    assert pipelined.check(result) == []
    gpipe, f1b = result["ranks"][0]["gpipe"], result["ranks"][0]["1f1b"]
    assert (gpipe["in_flight"], f1b["in_flight"]) == (4, 1)
    for r in (gpipe, f1b):
        assert r["peaks"] == [r["predicted"]] * cfg.steps
        assert pipelined.grad_diff(r, result["reference"]) <= TOLERANCE
    assert gpipe["predicted"] > f1b["predicted"]  # four micro-batches held against one
    if schedule == "every(1)":
        assert gpipe["modeled"] == gpipe["predicted"] and f1b["modeled"] == f1b["predicted"]
    else:
        assert gpipe["modeled"] is None
    text = pipelined.report(result)
    assert "all equal" in text and "MISMATCH" not in text


def test_a_wrong_prediction_is_a_mismatch(one_rank):
    result = one_stage(TINY, 2)
    result["ranks"][0]["1f1b"]["predicted"] += 8
    result["ranks"][0]["gpipe"]["grads"]["head.out.weight"] *= 1 + 1e-3
    bad = pipelined.check(result)
    assert any("1F1B stage 0 step 0: saved" in b for b in bad)
    assert any("GPipe stage 0: gradients off" in b for b in bad)
    assert "MISMATCH" in pipelined.report(result)


@pytest.fixture(scope="module", params=[2, 4])
def spawned(request):
    cfg = Config(**{**TINY.__dict__, "layers": 4, "batch": 8, "schedule": "every(1)"})
    return cfg, pipelined.run(request.param, cfg, pipeline.SCHEDULES, microbatches=4)


@pytest.mark.slow
def test_ranks_hold_what_ckptlab_predicts_and_train_as_one_process(spawned):
    cfg, result = spawned
    p = result["nproc"]
    assert pipelined.check(result) == []
    for kind in pipeline.SCHEDULES:
        for i, ranks in enumerate(result["ranks"]):
            r = ranks[kind]
            assert r["peaks"] == [r["predicted"]] * cfg.steps == [r["modeled"]] * cfg.steps
            assert r["in_flight"] == (4 if kind == "gpipe" else p - i)
    ref = result["reference"]["losses"]
    assert ref[-1] < ref[0]  # it trains
    assert "all equal" in pipelined.report(result)


@pytest.mark.parametrize("kw,message", [
    (dict(nproc=3, cfg=TINY), "2 layers cannot fill 3 stages"),
    (dict(nproc=2, cfg=TINY, microbatches=3), "batch 4 must be divisible by microbatches 3"),
    (dict(nproc=2, cfg=TINY, microbatches=1), "1F1B needs a micro-batch a stage at least"),
    (dict(nproc=2, cfg=TINY, microbatches=0), "m: expected an int >= 1"),
    (dict(nproc=2, cfg=TINY, kinds=("zb",)), "pipeline schedule: expected one of"),
])
def test_run_refuses_before_any_process_starts(kw, message, monkeypatch):
    monkeypatch.setattr(pipelined.cdist, "spawn", lambda *a: pytest.fail("spawned"))
    with pytest.raises(ValueError, match=message):
        pipelined.run(**kw)
