"""`python -m ckptlab.torch.demo` refuses bad options in one line, exit status 2, before any
work: zero, negative, fractional, NaN, infinite and huge values of every option, in the DDP,
--fsdp and --pipeline modes; sizes that cannot fit in memory or time are refused before a model
is built (a --seq of 10^8 used to build one for minutes); the pipeline's own rules (a block a
stage, equal micro-batches, 1F1B's at least one micro-batch a stage); a schedule that fits no
stage names the stage."""

import re

import pytest

torch = pytest.importorskip("torch")

from ckptlab.torch import demo, fsdp, nets, pipelined, training  # noqa: E402
from ckptlab.torch import dist as cdist  # noqa: E402


def work(*args, **kwargs):
    raise AssertionError("work started before the options were checked")


@pytest.fixture
def no_work(monkeypatch):
    """Nothing runs: no process, no training, no model built (the option check's own plan
    included: a case that needs it is in PLANNED)."""
    for module, name in ((demo, "run"), (demo, "train"), (demo, "_torchrun"), (fsdp, "main"),
                         (pipelined, "main"), (cdist, "spawn"), (nets, "GPT")):
        monkeypatch.setattr(module, name, work)


def one_line(rc, capsys, message):
    out, err = capsys.readouterr()
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert "Traceback" not in err and out == ""
    assert re.search(message, err), err


INT_OPTIONS = ("--nproc", "--steps", "--layers", "--width", "--heads", "--seq", "--batch",
               "--vocab")
BAD_INTS = ("0", "-1", "2.5", "nan", "inf", "1e3", "", "x")
FUZZ = [([mode, opt, v] if mode else [opt, v], r"expected an integer >= 1")
        for mode in ("", "--fsdp", "--pipeline") for opt in INT_OPTIONS for v in BAD_INTS]
FUZZ += [([mode, "--lr", v] if mode else ["--lr", v], r"--lr: expected")
         for mode in ("", "--pipeline") for v in ("0", "-1", "nan", "inf", "-inf", "", "x")]
FUZZ += [(["--seed", v], r"--seed: expected an integer") for v in ("-1", "nan", "1.5", "x")]
FUZZ += [(["--pipeline", "--microbatches", v], r"--microbatches: expected an integer >= 1")
         for v in ("0", "-3", "nan", "inf", "2.5")]

TOO_BIG = [  # (argv, message): refused by the size check, before a model is built
    (["--fsdp", "--seq", "100000000"], r"need ~[\d.]+ GB in 3 processes, but only"),
    (["--seq", "100000000"], r"need ~[\d.]+ GB"),
    (["--pipeline", "--seq", "100000000"], r"need ~[\d.]+ GB"),
    (["--layers", "1000000000"], r"need ~[\d.]+ GB"),
    (["--vocab", "10000000000"], r"need ~[\d.]+ GB"),
    (["--batch", "100000000000"], r"need ~[\d.]+ GB"),
    (["--attn", "math", "--width", "10000000", "--heads", "1"], r"need ~[\d.]+ GB"),
    (["--pipeline", "--nproc", "512", "--layers", "512", "--batch", "512",
      "--microbatches", "512"], r"need ~[\d.]+ GB in 513 processes"),
    (["--steps", "100000000"], r"would take at least [\d,]+ minutes"),
    (["--fsdp", "--seq", "30000", "--batch", "2"], r"would take at least [\d,]+ minutes"),
]

RULES = [
    (["--seed", "99999999999999999999"], r"--seed: expected an integer in \[0, "),
    (["--pipeline", "--fsdp"], r"not allowed with argument"),
    (["--microbatches", "2"], r"--microbatches is an option of --pipeline"),
    (["--fsdp", "--pipe-schedule", "gpipe"], r"--pipe-schedule is an option of --pipeline"),
    (["--pipeline", "--pipe-schedule", "zb"], r"invalid choice"),
    (["--pipeline", "--layers", "3", "--nproc", "4"], r"--layers 3 cannot fill --nproc 4"),
    (["--pipeline", "--microbatches", "3"], r"--batch 8 must be divisible by --microbatches 3"),
    (["--pipeline", "--nproc", "4", "--microbatches", "2"], r"1F1B needs at least one per stage"),
    (["--pipeline", "--nproc", "1000000"], r"cannot fill --nproc 1000000 stages"),
    (["--fsdp", "--nproc", "1000000"], r"--batch 8 must be divisible by --nproc 1000000"),
    (["--nproc", "1000000"], r"must divide 4"),
]


@pytest.mark.parametrize("argv,message", FUZZ + TOO_BIG + RULES,
                         ids=[" ".join(c[0]) for c in FUZZ + TOO_BIG + RULES])
def test_a_bad_option_is_one_line_before_any_work(argv, message, no_work, capsys):
    one_line(demo.main(argv), capsys, message)


PLANNED = [  # refused by the plan check: the one-process profile (or every stage's) runs
    (["--pipeline", "--schedule", "optimal(40%)"], r"--schedule 'optimal\(40%\)': stage 0 "
     r"\(blocks 0..1\): optimal: budget \d+ bytes is below"),
    (["--pipeline", "--schedule", "optimal(nan%)"], r"budget must be a finite number"),
    (["--pipeline", "--schedule", "optimal(1e400)"], r"budget must be a finite number"),
    (["--pipeline", "--schedule", "every(0)"], r"every: k must be an int >= 1"),
    (["--fsdp", "--schedule", "bogus"], r"schedule: unknown"),
]


@pytest.mark.parametrize("argv,message", PLANNED, ids=[" ".join(c[0]) for c in PLANNED])
def test_a_schedule_that_fits_no_stage_is_one_line(argv, message, monkeypatch, capsys):
    for module, name in ((demo, "run"), (fsdp, "main"), (pipelined, "main"), (cdist, "spawn")):
        monkeypatch.setattr(module, name, work)
    one_line(demo.main(argv + ["--width", "16", "--seq", "9", "--vocab", "16"]), capsys,
             message)


def test_the_documented_pipeline_options_pass_the_check(monkeypatch):
    """--pipeline --nproc 4 (and 2) with the defaults: planned on every stage, then run."""
    calls = []
    monkeypatch.setattr(pipelined, "main", lambda *a: calls.append(a) or 0)
    for n in (2, 4):
        assert demo.main(["--pipeline", "--nproc", str(n), "--seq", "9"]) == 0
    assert [(c[0], c[2], c[3], c[1].schedule) for c in calls] == [
        (2, ("gpipe", "1f1b"), 4, "every(1)"), (4, ("gpipe", "1f1b"), 4, "every(1)")]


def test_the_size_check_counts_processes_and_time():
    """check_size by hand: memory grows with the processes, time with the steps."""
    cfg = training.Config()
    training.check_size(cfg, 2)  # the defaults fit
    huge = training.Config(steps=10**9)
    with pytest.raises(ValueError, match="minutes"):
        training.check_size(huge, 2)
    many = int(training.available_ram() / training.PROCESS_BYTES) + 1
    with pytest.raises(ValueError, match=f"in {many + 1} processes"):
        training.check_size(cfg, many)
