"""The at-scale surfaces fuzzed as users and scripts would use them: every option of `plan`,
`bench plan-check` and `bench model-check` with bad, huge, zero, NaN and infinite values (one
line on stderr, exit 2, in well under a second: refused before any work); and the Python APIs
on random valid shapes and layouts (finite, positive, and the invariants that must hold)."""

import random
import time

import pytest

from ckptlab.cli import main as cli
from ckptlab.cluster import pipeline, planner, step_time
from ckptlab.cluster import step_memory as sm

BAD = ["0", "-1", "nan", "inf", "-inf", "1e20", "2.5", "", "abc", "9" * 23, "True"]
PLAN_OPTIONS = {
    "--gpus": BAD, "--memory-gb": BAD, "--batch": BAD, "--micro-batch": BAD,
    "--achievable": BAD + ["1.0001"], "--loss": BAD, "--recipe": BAD, "--gpu": BAD,
    "--zero3": BAD + ["megatron"],
    "--compare": BAD + ["8,0", "0,1", "8,1,1", "99999,99999"],
    "--model": BAD + ["gpt:1,8,1,8,8", "gpt:4097,128,1,8,8", "gpt:1,262144,1024,8,8",
                      "gpt:1,128,1,2097152,8", "gpt:1,128,1,8,8388608"],
}


def one_line_refusal(argv, capsys):
    start = time.perf_counter()
    rc = cli.main(argv)
    elapsed = time.perf_counter() - start
    err = capsys.readouterr().err.strip()
    return rc, err, elapsed


@pytest.mark.parametrize("option,value", [(o, v) for o, vs in PLAN_OPTIONS.items() for v in vs])
def test_plan_refuses_bad_values_in_one_line(option, value, capsys):
    argv = ["plan", option, value] + ([] if option == "--memory-gb" else ["--memory-gb", "24"])
    rc, err, elapsed = one_line_refusal(argv, capsys)
    if rc == 2:
        assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    else:  # a value that is fine after all (e.g. --gpus 1e20 is not an int: refused above)
        assert rc in (0, 1) and err == ""
    assert elapsed < 3


@pytest.mark.parametrize("argv", [
    ["bench", "plan-check", "--csv", ""], ["bench", "plan-check", "--csv", "/"],
    ["bench", "plan-check", "--csv", "/no/such/dir/x.csv"], ["bench", "plan-check", "--x"],
    ["bench", "model-check", "--achievable", "nan"],
    ["bench", "model-check", "--achievable", "inf"],
    ["bench", "model-check", "--achievable", "-1"], ["bench", "model-check", "--png", "/"],
    ["bench", "model-check", "--csv", "/no/such/dir/x.csv"],
])
def test_benches_refuse_bad_values_before_the_work(argv, capsys):
    rc, err, elapsed = one_line_refusal(argv, capsys)
    assert rc == 2 and "\n" not in err and "Traceback" not in err
    assert elapsed < 1


def random_case(rng):
    heads = rng.choice([1, 2, 4, 8])
    d = rng.choice([8, 16, 64])
    layers = rng.choice([1, 2, 3, 4, 6, 8, 12])
    model = sm.GPTShape(layers, heads * d, heads, rng.choice([1, 7, 64, 128]),
                        rng.choice([8, 64, 1000]) * 8, tied=rng.random() < 0.5)
    ps = [p for p in (1, 2, 3, 4) if layers % p == 0]
    p = rng.choice(ps)
    vs = [v for v in (1, 2, 3) if (layers // p) % v == 0 and (v == 1 or p > 1)]
    v = rng.choice(vs)
    t = rng.choice([x for x in (1, 2, 4, 8) if heads % x == 0])
    layout = sm.Layout(rng.choice([1, 2, 8]), t, rng.random() < 0.5 and t > 1,
                       rng.choice([0, 1, 2, 3]), rng.choice([1, 2, 5]), p, v)
    m = p * rng.choice([1, 2, 3])
    return model, layout, m


@pytest.mark.parametrize("seed", range(40))
def test_random_valid_cases_hold_the_invariants(seed):
    rng = random.Random(seed)
    model, layout, m = random_case(rng)
    recompute = rng.choice(sm.RECOMPUTE)
    loss = rng.choice(sorted(sm.LOSSES))
    recipe = rng.choice(sorted(sm.RECIPES))
    kw = dict(recipe=recipe, recompute=recompute, loss=loss, micro_batches=m)
    stages = [sm.step_memory(model, layout, stage=i, **kw) for i in range(layout.pp)]
    worst = sm.step_memory(model, layout, **kw)
    assert worst.peak == max(x.peak for x in stages) > 0  # the first or last is the fullest
    assert all(v >= 0 for x in stages for v in [*x.terms.values(), *x.transients.values()])
    # more micro-batches never hold less (except interleaved at m = p, where Megatron's
    # schedule runs every forward first); ZeRO-3 over more ranks never holds more
    more = sm.step_memory(model, layout, **dict(kw, micro_batches=2 * m))
    assert more.peak >= worst.peak or (layout.vp > 1 and m == layout.pp)
    if layout.zero == 3:
        wider = sm.Layout(layout.dp * 2, layout.tp, layout.sp, 3, layout.micro_batch,
                          layout.pp, layout.vp)
        assert sm.step_memory(model, wider, **kw).peak <= worst.peak
    # in flight: never more than the micro-batches, the first stage the most
    flights = [sum(pipeline.in_flight(i, layout.pp, m, layout.vp)) for i in range(layout.pp)]
    assert flights == sorted(flights, reverse=True) and flights[0] <= m * layout.vp
    if model.hidden // model.heads % 8 == 0:
        st = step_time.step_time(model, layout, "a100", recipe, recompute, micro_batches=m,
                                 loss=loss)
        assert 0 < st.step_s < float("inf")
        assert all(v >= 0 for v in st.terms.values())


@pytest.mark.parametrize("seed", range(6))
def test_the_plan_is_never_slower_than_any_layout_it_tried(seed):
    rng = random.Random(100 + seed)
    heads = rng.choice([4, 8])
    model = sm.GPTShape(rng.choice([4, 6, 8]), heads * 64, heads, 256, 1024)
    gpus = rng.choice([1, 4, 16])
    batch = gpus * rng.choice([1, 2, 4])
    chosen, rows = planner.plan(model, gpus, "a100", rng.choice([1, 4, 80]) * 2**30, batch)
    fits = [o for _, o in rows if isinstance(o, planner.Option)]
    if chosen is None:
        assert not fits
    else:
        assert all(chosen.step_s <= o.step_s for o in fits)
        assert chosen.peak <= chosen.memory.peak
