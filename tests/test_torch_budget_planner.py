"""bench/budget_planner.py: a bad option is one line and exit status 2 before any work (an empty
model used to run a minute and exit 0; a bad --out or size, a traceback); and (slow: a compile
per budget) a small run's rows hold what the bench says it compares: ckptlab's op-level plan made
before torch's bytes exist and within its own budget, the peak at least the end-of-forward bytes,
the replayed ops that matmul FLOPs leave out, and a flag where both planners recompute 0 FLOPs; and
(no compile: stand-ins for it) that ckptlab's rows do not move when torch's bytes do."""

import importlib.util
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parent.parent / "bench" / "budget_planner.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("budget_planner", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def work(*args, **kwargs):
    raise AssertionError("work started before the options were checked")


BAD = [
    (["--width", "0"], r"--width: expected an integer >= 1"),
    (["--batch", "0"], r"--batch: expected an integer >= 1"),
    (["--layers", "-1"], r"--layers: expected an integer >= 1"),
    (["--seq", "nan"], r"--seq: expected an integer >= 1"),
    (["--vocab", "2.5"], r"--vocab: expected an integer >= 1"),
    (["--heads", "3"], r"width 64 must be divisible by heads 3"),
    (["--repeats", "0"], r"--repeats: expected an integer >= 1"),
    (["--budgets", ""], r"--budgets: expected numbers in \(0, 1\]"),
    (["--budgets", "0"], r"--budgets: expected numbers in \(0, 1\], got '0'"),
    (["--budgets", "0.2,1.5"], r"--budgets: expected numbers in \(0, 1\]"),
    (["--budgets", "nan"], r"--budgets: expected numbers in \(0, 1\]"),
    (["--budgets", "inf"], r"--budgets: expected numbers in \(0, 1\]"),
    (["--budgets", "a,b"], r"--budgets: expected numbers in \(0, 1\] separated by commas"),
    (["--seq", "1000000000"], r"needs ~[\d.]+ GB but only"),
    (["--width", "4000000", "--heads", "1"], r"needs ~[\d.]+ GB but only"),
    (["--width", "512", "--heads", "8", "--layers", "24", "--repeats", "1000"],
     r"would take at least [\d,]+ minutes"),
    (["--repeats", "100000000"], r"would take at least [\d,]+ minutes"),
    (["--out", "/dev/null/x"], r"--out /dev/null/x: (cannot create it|exists and is not)"),
    (["--out", str(BENCH)], r"exists and is not a folder"),
    (["--bogus"], r"unrecognized arguments"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(c[0]) for c in BAD])
def test_a_bad_option_is_one_line_before_any_work(bench, argv, message, monkeypatch, capsys):
    monkeypatch.setattr(bench, "run", work)
    monkeypatch.setattr(bench.nets, "GPT", work)
    assert bench.main(argv) == 2
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert "Traceback" not in err and out == ""
    assert re.search(message, err), err


@pytest.mark.slow
def test_a_small_run_compares_what_it_says(bench, tmp_path, capsys):
    argv = ["--out", str(tmp_path), "--layers", "2", "--width", "32", "--heads", "2",
            "--seq", "16", "--batch", "2", "--budgets", "0.3,0.9", "--repeats", "2"]
    assert bench.main(argv) == 0
    text = capsys.readouterr().out
    rows = list(bench.csv.DictReader(open(tmp_path / "budget_planner.csv")))
    assert (tmp_path / "budget_planner.png").stat().st_size > 0
    by = {(r["budget"], r["method"]): r for r in rows}
    for b in ("0.3", "0.9"):
        ours, theirs = by[(b, "op-level")], by[(b, "torch.compile")]
        timed = by[(b, "op-level(time)")]
        for r in (ours, timed):  # within its own budget, fixed before torch ran
            assert int(r["saved_bytes"]) <= int(r["budget_bytes"]) == int(ours["budget_bytes"])
        for r in (ours, theirs):
            assert int(r["peak_bytes"]) >= int(r["saved_bytes"]) > 0
        both0 = int(ours["recompute_flops"]) == 0 == int(theirs["recompute_flops"])
        assert ("both 0 FLOPs" in ours["note"]) == both0 == ("both 0 FLOPs" in theirs["note"])
    keep = by[("-", "keep(matmul)")]
    assert int(keep["recompute_flops"]) == 0 < int(keep["replayed_ops"])  # what FLOPs miss
    assert int(by[("-", "none")]["replayed_ops"]) == 0
    assert "op-level (planned first, by FLOPs) / torch.compile" in text


def test_ckptlab_plans_before_torchs_bytes_exist(bench, tmp_path, monkeypatch, capsys):
    """The op-level rows come out the same whatever torch.compile's run holds: two stand-ins for
    torch.compile that hold different bytes (eager, which keeps everything, and every block
    checkpointed) leave ckptlab's budget, its choice's bytes and FLOPs unchanged, while the
    plan made at torch's bytes (op-level@torch) follows them. The CPU's time model is fixed so
    that the time-costed plan sees the same numbers in both runs."""
    monkeypatch.setattr(bench.op_plan.TimeModel, "measure",
                        classmethod(lambda cls, repeats=21: cls(1e-5, 1e10, 1e10)))
    stand_ins = {"keeps all": lambda model, x, y, b: (lambda: model(x, y)),
                 "every(1)": lambda model, x, y, b: (lambda: model(x, y, schedule="every(1)"))}
    runs = {}
    for name, fake in stand_ins.items():
        monkeypatch.setattr(bench, "compiled", fake)
        out = tmp_path / name.replace("(", "").replace(")", "").replace(" ", "")
        argv = ["--out", str(out), "--layers", "2", "--width", "32", "--heads", "2",
                "--seq", "16", "--batch", "2", "--budgets", "0.3,0.9", "--repeats", "1"]
        assert bench.main(argv) == 0
        capsys.readouterr()
        runs[name] = {(r["budget"], r["method"]): r
                      for r in bench.csv.DictReader(open(out / "budget_planner.csv"))}
    a, b = runs.values()
    for budget in ("0.3", "0.9"):
        assert a[(budget, "torch.compile")]["saved_bytes"] != b[(budget, "torch.compile")][
            "saved_bytes"]  # the stand-ins differ
        for method in ("op-level", "op-level(time)"):
            for column in ("budget_bytes", "saved_bytes", "recompute_flops", "replayed_ops"):
                assert a[(budget, method)][column] == b[(budget, method)][column], (method, column)
        for r, fake in ((a, "keeps all"), (b, "every(1)")):  # planned at torch's bytes instead
            assert r[(budget, "op-level@torch")]["budget_bytes"] == \
                r[(budget, "torch.compile")]["saved_bytes"], fake
