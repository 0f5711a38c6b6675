"""Schedules: predictions (peak saved bytes, recompute FLOPs, snapshots) equal the engine's
measured ledger; the memory law (sqrt L) and the FLOP law (4/3); Revolve and the DP optimal
against brute force over every plan of small chains; budgets below the minimum refused."""

import numpy as np
import pytest
from test_optimal import synthetic

from ckptlab import engine, models
from ckptlab.engine import Tensor
from ckptlab.measure import plots
from ckptlab.recompute import ledger, schedules
from ckptlab.recompute.checkpoint import Seg

R = np.random.default_rng(5)


def mlp_case(layers=7, dropout=0.2):
    m = models.MLP(width=8, layers=layers, dropout=dropout, seed=1)
    return m, R.standard_normal((5, 8)), R.integers(0, 8, 5)


def gpt_case(attn="flash"):
    m = models.GPT(vocab=11, ctx=6, width=8, heads=2, layers=4, dropout=0.2, attn=attn, seed=2)
    return m, R.integers(0, 11, (2, 6)), R.integers(0, 11, (2, 6))


def measure(model, x, y, schedule):
    engine.manual_seed(7)
    model.zero_grad()
    with ledger.record() as led:
        model.loss(Tensor(x), y, schedule=schedule).backward()
    return led


SPECS = ["none", "sqrt", "every(2)", "uniform(3)", "revolve(1)", "revolve(2)", "revolve(3)",
         "selective(matmul)", "chen_greedy(4000)", "optimal(70%)", "optimal(35%)"]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("case", ["mlp", "gpt-flash", "gpt-naive"])
def test_prediction_equals_measured_ledger(case, spec):
    model, x, y = mlp_case() if case == "mlp" else gpt_case(case.split("-")[1])
    prof = model.profile(x, y, policies=["matmul"])
    if spec.startswith("chen") and case != "mlp":
        spec = "chen_greedy(16000)"  # a transformer block saves ~14 kB here
    sched = schedules.make(spec, prof=prof)
    pred = sched.predict(prof)
    led = measure(model, x, y, sched)
    assert led.peak == pred.peak_bytes
    assert led.flops["recompute"] == pred.recompute_flops
    assert led.model_flops == pred.model_flops
    assert led.peak_checkpoints == pred.peak_snapshots
    assert led.bytes == 0


def test_sqrt_memory_grows_as_sqrt_L_and_none_as_L():
    """Fitted log-log slope of the measured peak over L = 4, 16, 64, 256. The head and the
    last segment add a constant, so the slopes sit a little off 0.5 and 1.0: within 0.1."""
    x, y = R.standard_normal((2, 4)), R.integers(0, 3, 2)
    Ls, peaks = [4, 16, 64, 256], {"none": [], "sqrt": []}
    for L in Ls:
        m = models.MLP(width=4, hidden=4, layers=L, classes=3)
        for spec in peaks:
            peaks[spec].append(measure(m, x, y, spec).peak)
    assert abs(plots.fit_loglog_slope(Ls, peaks["none"]) - 1.0) < 0.1
    assert abs(plots.fit_loglog_slope(Ls, peaks["sqrt"]) - 0.5) < 0.1


def test_sqrt_recompute_is_one_forward_hardware_over_model_near_4_3():
    """Full sqrt recompute runs every block forward once more: hardware/model = 1 + F/(F + B).
    With backward = 2 x forward that is 4/3; bias and pointwise FLOPs make B/F = 1.97 here
    (matmul-dominated blocks), so the ratio is 4/3 within 0.01."""
    m = models.MLP(width=16, hidden=64, layers=16, classes=4)
    x, y = R.standard_normal((8, 16)), R.integers(0, 4, 8)
    prof = m.profile(x, y)
    led = measure(m, x, y, "sqrt")
    block_fwd = sum(s.fwd_flops for s in prof.stages[:16])
    assert led.flops["recompute"] == block_fwd
    assert abs(led.hardware_flops / led.model_flops - 4 / 3) < 0.01


def test_measured_peak_never_exceeds_the_budget():
    model, x, y = gpt_case()
    prof = model.profile(x, y)
    top = schedules.none(4).predict(prof).peak_bytes
    for frac in (1.0, 0.7, 0.5, 0.4, 0.3):
        led = measure(model, x, y, schedules.optimal(frac * top, prof))
        assert led.peak <= frac * top
    for s in (1, 2, 3):
        assert measure(model, x, y, schedules.revolve(s, 4)).peak_checkpoints <= s


def test_budgets_below_the_minimum_name_it():
    model, x, y = mlp_case()
    prof = model.profile(x, y)
    with pytest.raises(ValueError, match="minimum feasible peak"):
        schedules.optimal(100, prof)
    with pytest.raises(ValueError, match="minimum feasible 1"):
        schedules.revolve(0, 5)


# ------------------------------------------------------------------------------ inspection


def test_steps_are_inspectable_before_running():
    prof = synthetic([10] * 5, [30] * 4, [True] * 4, [False] * 4, [1] * 4)
    pred = schedules.sqrt(4).predict(prof)
    assert pred.describe() == ("+x0 f0 f1 +x2 f2 f3 R2 R3 B3 B2 -x2 R0 R1 B1 B0 -x0")
    assert schedules.sqrt(4).describe() == pred.describe()  # no profile needed to read it
    assert pred.peak_bytes == 10 + 10 + 2 * 30 + 10  # x0, x2, then block 2 (x2 shared) and 3
    values, spans = pred.timeline()
    assert max(values) == pred.peak_bytes and [s[2] for s in spans] == \
        ["forward", "recompute", "backward", "recompute", "backward"]
    fig = plots.plot_memory_trace({"sqrt": values}, spans)
    ax = fig.axes[0]
    (line,) = ax.get_lines()
    assert list(line.get_ydata()) == values and "(B)" in ax.get_ylabel()  # 90 bytes: unit B
    assert ax.get_legend().get_texts()[0].get_text() == "sqrt"
    assert len(ax.patches) == len(spans)  # one shaded span per phase
    model, x, y = mlp_case(layers=4)
    mprof = model.profile(x, y)
    led = measure(model, x, y, schedules.sqrt(4))
    mpred = schedules.sqrt(4).predict(mprof)
    ax = mpred.plot(measured=led).axes[0]
    predicted, measured = ax.get_lines()
    scale = mpred.peak_bytes / max(predicted.get_ydata())  # the unit the axis is drawn in
    assert [t.get_text() for t in ax.get_legend().get_texts()][:2] == \
        ["predicted", "measured (per op)"]
    assert np.allclose(predicted.get_ydata() * scale, mpred.timeline()[0])
    assert np.allclose(measured.get_ydata() * scale, led.timeline()[0])
    assert max(measured.get_ydata()) * scale == pytest.approx(led.peak)


def test_builders_give_the_plans_and_peaks_worked_by_hand():
    """The plan each builder makes, written out by hand, and its peak on a uniform chain
    (x = 10 bytes in, 30 inside, each block saving its input) summed by hand: not a
    prediction compared with a run of the same plan."""
    prof = synthetic([10] * 5, [30] * 4, [True] * 4, [False] * 4, [1] * 4)
    cases = {  # spec: (plan, peak)
        "none": ([0, 1, 2, 3], 4 * (10 + 30)),  # every block's input and inside
        "every(1)": ([Seg([0]), Seg([1]), Seg([2]), Seg([3])], 4 * 10 + 30),  # x0..x3, one block
        "every(3)": ([Seg([0, 1, 2]), Seg([3])], 10 + 3 * 30 + 2 * 10),  # 0..2 again (x3 gone)
        "uniform(2)": ([Seg([0, 1]), Seg([2, 3])], 10 + 10 + 30 + 40),  # x0, x2; 2 (x2) and 3
        "revolve(1)": ([Seg([Seg([Seg([0]), 1]), 2]), 3], 10 + 40),  # x0 and one block
        "revolve(2)": ([Seg([0]), Seg([Seg([1]), 2]), 3], 2 * 10 + 40),  # x0, x1, one block
    }
    for spec, (plan, peak) in cases.items():
        sched = schedules.make(spec, 4)
        assert sched.plan == plan, spec
        assert sched.predict(prof).peak_bytes == peak, spec
    assert schedules.make("uniform(3)", 7).plan == [Seg([0, 1]), Seg([2, 3, 4]), Seg([5, 6])]
    assert schedules.make("sqrt", 16).plan == [Seg(range(a, a + 4)) for a in (0, 4, 8, 12)]
    assert schedules.make("keep(matmul)", 2).plan == [Seg([0], "matmul"), Seg([1], "matmul")]


def test_make_parses_and_refuses():
    assert schedules.make("every(3)", 7).plan == [Seg([0, 1, 2]), Seg([3, 4, 5]), Seg([6])]
    assert schedules.make(" sqrt ", 9).plan == [Seg([0, 1, 2]), Seg([3, 4, 5]), Seg([6, 7, 8])]
    for bad in ("sqrtt", "every()", "every(x)", "optimal(5)"):
        with pytest.raises(ValueError):
            schedules.make(bad, 4)


@pytest.mark.parametrize("spec", ["optimal(nan)", "optimal(inf)", "optimal(-5)", "optimal(1e999)",
                                  "optimal(nan%)", "optimal(-10%)", "chen_greedy(nan)",
                                  "chen_greedy(inf)", "chen_greedy(-1)", "optimal()",
                                  "optimal( )"])
def test_a_budget_that_is_not_a_finite_number_of_bytes_is_refused(spec):
    """Not "max() arg is an empty sequence" or an OverflowError: one ValueError that names the
    spec and says what a budget must be."""
    model, x, y = mlp_case(layers=3)
    prof = model.profile(x, y)
    with pytest.raises(ValueError, match=r"budget|unknown or incomplete") as e:
        schedules.make(spec, prof=prof)
    assert spec.split("(")[0] in str(e.value)


def test_selective_needs_a_profile_with_its_policy():
    model, x, y = mlp_case(layers=3)
    sched = schedules.make("selective(matmul)", 3)
    with pytest.raises(ValueError, match=r"keep\(matmul\).*policies=\[.matmul.\]"):
        sched.predict(model.profile(x, y))
    assert sched.predict(model.profile(x, y, policies=["matmul"])).peak_bytes > 0
