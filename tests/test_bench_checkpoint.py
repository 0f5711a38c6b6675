"""The checkpoint benchmark: its by-hand baseline does the engine's work (equal gradients), and
its rows carry predictions that the measured ledger meets. Nothing here asserts a time."""

import sys

import numpy as np
import pytest

from ckptlab import engine, models
from ckptlab.cli import bench_checkpoint, checkpoint_report
from ckptlab.cli.hand_step import hand_step
from ckptlab.engine import Tensor

R = np.random.default_rng(2)


@pytest.mark.parametrize("case", ["mlp", "gpt-naive", "gpt-flash"])
def test_hand_written_step_equals_the_engine(case):
    """Same math, float64, same dropout masks: gradients agree to 1e-12 relative (the
    engine and the hand code round differently in a few places, e.g. D from P dP or dO O).
    The key bias's true gradient is zero, so errors are taken against max(|g|, 1e-3 max|g|)."""
    if case == "mlp":
        m = models.MLP(width=8, layers=4, dropout=0.3, seed=1)
        x, y = R.standard_normal((5, 8)), R.integers(0, 8, 5)
    else:
        m = models.GPT(vocab=13, ctx=6, width=8, heads=2, layers=2, dropout=0.2,
                       attn=case.split("-")[1], seed=1)
        x, y = R.integers(0, 13, (2, 6)), R.integers(0, 13, (2, 6))
    engine.manual_seed(4)
    m.zero_grad()
    loss = m.loss(Tensor(x), y)
    loss.backward()
    engine.manual_seed(4)
    hand_loss, hand = hand_step(m, x, y)
    assert float(hand_loss) == pytest.approx(loss.item(), rel=1e-13)
    assert set(hand) == set(m.params)
    floor = 1e-3 * max(np.linalg.norm(g) for g in hand.values())
    for k, p in m.params.items():
        err = np.linalg.norm(p.grad - hand[k])
        assert err <= 1e-12 * max(np.linalg.norm(hand[k]), floor), k


SPECS = ["none", "sqrt", "optimal(60%)", "keep(matmul)"]


def gpt_rows(with_torch):
    return bench_checkpoint.run("gpt", layers=3, schedule_specs=SPECS, width=16, batch=2, seq=8,
                                heads=2, repeats=1, with_torch=with_torch)


def test_rows_meet_their_predictions_and_print():
    rows = gpt_rows(with_torch=False)
    assert rows[0]["schedule"].startswith("by hand")
    for r in rows[1:]:
        assert r["measured_peak_bytes"] == r["predicted_peak_bytes"]
        assert r["hardware_flops"] >= r["model_flops"] > 0
        assert r["allocator_peak_bytes"] > 0
        assert r["torch_note"].startswith("not asked") and "torch_step_s" not in r
    none, sqrt = rows[1], rows[2]
    assert sqrt["measured_peak_bytes"] < none["measured_peak_bytes"]
    assert "predicted" in checkpoint_report.table(rows)


def test_the_pytorch_twin_counts_its_saved_tensors(torch):
    rows = gpt_rows(with_torch=True)
    assert "torch_saved_peak_bytes" in rows[1] and "torch_note" in rows[-1]
    none, sqrt = rows[1], rows[2]
    assert sqrt["torch_saved_peak_bytes"] < none["torch_saved_peak_bytes"]
    assert all(r["torch_step_s"] > 0 for r in rows[1:-1])


def test_without_pytorch_the_rows_say_so(monkeypatch):
    """As in the README's venv: `import torch` fails, the twin's columns are a note."""
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    rows = bench_checkpoint.run("mlp", layers=2, schedule_specs=["none"], width=8, batch=4,
                                repeats=1, with_torch=True)
    assert rows[1]["torch_note"] == "PyTorch is not installed"


def test_main_runs_and_refuses_bad_arguments(capsys):
    assert bench_checkpoint.main(["--model", "mlp", "--layers", "4", "--width", "8", "--batch",
                                  "4", "--schedule", "none,sqrt", "--repeats", "1",
                                  "--no-torch"]) == 0
    assert "sqrt" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench_checkpoint.main(["--layers", "0"])
    with pytest.raises(SystemExit):
        bench_checkpoint.main(["--layers", "4", "--schedule", "bogus", "--no-torch"])


def _row(name, samples):
    q2, q1, q3 = np.percentile(samples, [50, 25, 75])
    return {"model": "mlp", "layers": 4, "width": 8, "batch": 2, "dtype": "float32",
            "device": "cpu", "repeats": len(samples), "schedule": name, "plan": "[]",
            "predicted_peak_bytes": 1, "measured_peak_bytes": 1, "prediction_error": 0.0,
            "allocator_peak_bytes": 1, "model_flops": 1, "hardware_flops": 1,
            "hfu_over_mfu": 1.0, "step_s": q2, "step_q1_s": q1, "step_q3_s": q3,
            "step_over_hand": 1.0, "model_gflop_per_s": 1.0, "torch_note": "not asked for"}


def test_the_table_shows_each_spread_and_warns_when_rows_cannot_be_ordered():
    hand = {**_row("by hand", [0.9e-3, 1e-3, 1.1e-3]), "schedule": "by hand"}
    for key in ("predicted_peak_bytes", "torch_note"):
        del hand[key]
    apart = [hand, _row("none", [1e-3, 1.1e-3, 1.2e-3]), _row("sqrt", [2e-3, 2.1e-3, 2.2e-3])]
    text = checkpoint_report.table(apart)
    assert "1.10 [1.05-1.15] ms" in text and "2.10 [2.05-2.15] ms" in text  # median [IQR]
    assert "warning" not in text and checkpoint_report.overlapping(apart) == []
    assert "PyTorch twin (torch step, torch saved) not run" in text
    assert "torch '-' for none, sqrt: not asked for" in text
    close = apart[:2] + [_row("sqrt", [1.05e-3, 1.12e-3, 1.3e-3])]
    assert checkpoint_report.overlapping(close) == [("none", "sqrt")]
    warning = checkpoint_report.table(close).splitlines()[-1]
    assert warning.startswith("warning: 1 pair(s)") and "none ~ sqrt" in warning
    assert "--repeats (now 3)" in warning


def test_step_and_over_hand_agree_and_every_time_has_its_spread(tmp_path):
    rows = bench_checkpoint.run("mlp", layers=3, schedule_specs=["none", "sqrt"], width=8,
                                batch=4, repeats=3, with_torch=False)
    hand = rows[0]
    for r in rows:
        assert r["step_q1_s"] <= r["step_s"] <= r["step_q3_s"]
    for r in rows[1:]:
        assert r["step_over_hand"] == r["step_s"] / hand["step_s"]
    paths = checkpoint_report.figures(rows, tmp_path)
    assert all(p.stat().st_size > 5000 for p in paths)


def test_the_recompute_attn_row_says_why_torch_has_no_number():
    rows = bench_checkpoint.run("gpt", layers=2, schedule_specs=["none", "recompute(attn)"],
                                width=8, batch=1, seq=6, heads=2, repeats=1)
    assert rows[2]["schedule"] == "recompute(attn)"
    assert rows[2]["measured_peak_bytes"] == rows[2]["predicted_peak_bytes"]
    assert "torch '-' for recompute(attn): the twin does not recompute inside an op" in \
        checkpoint_report.table(rows)


def test_a_checkpointed_step_faster_than_none_says_why():
    """When a schedule measures faster than none, IQRs apart (recompute alone cannot do that),
    the table's note and the figure's title say why: the allocator's peaks, measured, beside
    each other (or, when the faster one's is not smaller, that it is likely load)."""
    from ckptlab.cli import bench_checkpoint as bc
    from ckptlab.cli import checkpoint_report as cr
    from ckptlab.measure import plots

    rows = bc.run("mlp", layers=4, schedule_specs=["none", "sqrt"], width=8, batch=4,
                  repeats=3, with_torch=False)
    by = {r["schedule"]: r for r in rows}
    assert "note:" not in cr.table(rows) or by["sqrt"]["step_q3_s"] < by["none"]["step_q1_s"]
    by["none"].update(step_s=2e-3, step_q1_s=1.9e-3, step_q3_s=2.1e-3)
    by["sqrt"].update(step_s=1e-3, step_q1_s=0.9e-3, step_q3_s=1.1e-3)
    text = cr.table(rows)
    assert "note: sqrt measured faster than none, beyond the noise" in text, text
    alloc = by["sqrt"]["allocator_peak_bytes"] < by["none"]["allocator_peak_bytes"]
    assert ("the allocator peaks at" in text) == alloc and ("likely load" in text) != alloc
    fig = plots.plot_memory_vs_time(cr.time_points(rows), device="cpu")
    assert "measured faster than none" in fig.axes[0].get_title().replace("\n", " ")
