"""More bad invocations, each one line on stderr and exit status 2 before any work (the rules
of tests/test_cli_errors.py): an empty --gpus, a torch model whose heads do not divide its
width or too big for memory, more threads than CPUs, a GEMM or a flash pair too big for memory
or too long to run, a --png that is a file, output paths checked before the work (bench
crossing --csv, bench torch --csv), a bad CKPTLAB_CACHE_DIR, and the DDP demo
(`python -m ckptlab.torch.demo`), a command like the others."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ckptlab.cli import bench_checkpoint, bench_crossing, bench_emu, bench_torch
from ckptlab.cli import main as cli

REPO = Path(__file__).resolve().parent.parent


def work(*args, **kwargs):
    raise AssertionError("work started before the arguments were checked")


@pytest.fixture
def forbid_work(monkeypatch):
    monkeypatch.setattr(bench_crossing.crossing, "recompute_gains", work)
    monkeypatch.setattr(bench_crossing, "measure_gains", work)
    monkeypatch.setattr(bench_torch, "run", work)
    monkeypatch.setattr(bench_emu, "run", work)
    monkeypatch.setattr(bench_checkpoint, "run", work)


def one_line(rc, capsys, message):
    out, err = capsys.readouterr()
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert "Traceback" not in err and out == ""
    assert re.search(message, err), err


CASES = [
    (["bench", "crossing", "--gpus", ""], r"--gpus: expected comma-separated GPU names"),
    (["bench", "crossing", "--gpus", " , "], r"--gpus: expected comma-separated GPU names"),
    (["bench", "crossing", "--csv", "{missing}/x.csv"], "does not exist"),
    (["bench", "attention", "--gpus", ""], r"--gpus: expected comma-separated GPU names"),
    (["bench", "attention", "--gpus", ","], r"--gpus: expected comma-separated GPU names"),
    (["bench", "crossing", "--csv", "{dir}"], "is a folder"),
    (["bench", "emu", "--size", "100000"], r"needs ~120\.00 GB .*choose a smaller --size"),
    (["bench", "emu", "--flash-n", "10000000000"], r"flash attention at B=1 H=1 N=10000000000 "
                                                   r"d=64 needs ~\d+\.\d+ GB"),
    (["bench", "emu", "--flash-n", "100000"], r"would take at least 27\.6 h .* \(at most 1 h\)"),
    (["bench", "emu", "--repeats", "99999999999"], "would take at least"),
    (["bench", "emu", "--flash-repeats", "99999999999"], "would take at least"),
    (["bench", "emu", "--size", "4096"], "would take at least"),
    (["bench", "checkpoint", "--png", "{file}", "--layers", "2", "--width", "8", "--batch",
      "4", "--no-torch", "--repeats", "1"], r"--png .*afile: exists and is not a folder"),
    (["bench", "checkpoint", "--png", "{file}/sub"], r"--png .*: cannot create it"),
]
TORCH_CASES = [
    (["bench", "torch", "--width", "7"], "width 7 must be divisible by heads 4"),
    (["bench", "torch", "--heads", "5"], "width 64 must be divisible by heads 5"),
    (["bench", "torch", "--width", "12", "--heads", "3"], r"head dim .* = 4: ckptlab's kernels"),
    (["bench", "torch", "--heads", "0"], "expected an integer >= 1"),
    (["bench", "torch", "--threads", "x"], "expected an integer >= 1"),
    (["bench", "torch", "--csv", "{missing}/x.csv"], "does not exist"),
    (["bench", "torch", "--layers", "99999999999"], r"torch GPT at L=99999999999 .* needs ~"),
    (["bench", "torch", "--seq", "99999999999"], r"seq=99999999999 needs ~\d+\.\d+ GB"),
    (["bench", "torch", "--batch", "99999999999"], r"batch=99999999999 .* needs ~"),
    (["bench", "torch", "--threads", "99999999999"], r"--threads 99999999999: at most the \d+"),
]


def paths(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    return {"file": str(afile), "missing": str(tmp_path / "missing"), "dir": str(tmp_path)}


@pytest.mark.parametrize("argv,message", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_a_bad_invocation_is_one_line_before_any_work(argv, message, tmp_path, forbid_work,
                                                      capsys):
    rc = cli.main([a.format(**paths(tmp_path)) for a in argv])
    one_line(rc, capsys, message)
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("argv,message", TORCH_CASES, ids=[" ".join(c[0]) for c in TORCH_CASES])
def test_bench_torch_checks_its_model_and_path_first(argv, message, tmp_path, forbid_work,
                                                     capsys, torch):
    rc = cli.main([a.format(**paths(tmp_path)) for a in argv])
    one_line(rc, capsys, message)


@pytest.mark.parametrize("where,message", [
    ("{file}", "afile is not a folder"),               # a file
    ("{file}/sub", r"cannot create it \(Not a directory\)"),  # below a file
    ("/proc/ckptlab-cache", "cannot create it"),       # where nobody can create a folder
    ("/proc", "cannot write in it|owned by"),          # a folder nobody can write
])
def test_a_bad_cache_dir_is_one_line(where, message, tmp_path, forbid_work, monkeypatch,
                                     capsys):
    monkeypatch.setenv("CKPTLAB_CACHE_DIR", where.format(**paths(tmp_path)))
    rc = cli.main(["bench", "crossing"])
    one_line(rc, capsys, "CKPTLAB_CACHE_DIR=.*" + message)


def test_a_good_cache_dir_is_created_private(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CKPTLAB_CACHE_DIR", str(tmp_path / "a" / "cache"))
    assert cli.main(["bench", "crossing", "--d", "64", "--gpus", "A100"]) == 0
    assert (tmp_path / "a" / "cache").stat().st_mode & 0o777 == 0o700


DEMO = [  # (argv, a part of the message)
    (["--nproc", "0"], "--nproc: expected an integer >= 1"),
    (["--nproc", "3"], "--nproc 3 must divide 4"),
    (["--steps", "0"], "--steps: expected an integer >= 1"),
    (["--steps", "2.5"], "--steps: expected an integer >= 1"),
    (["--layers", "0"], "--layers: expected an integer >= 1"),
    (["--width", "0"], "--width: expected an integer >= 1"),
    (["--width", "7"], "width 7 must be divisible by heads 2"),
    (["--width", "12", "--heads", "3"], "head dim .* = 4"),
    (["--heads", "0"], "--heads: expected an integer >= 1"),
    (["--seq", "0"], "--seq: expected an integer >= 1"),
    (["--batch", "0"], "--batch: expected an integer >= 1"),
    (["--batch", "5"], "--batch 5 must be divisible by --nproc 2"),
    (["--vocab", "0"], "--vocab: expected an integer >= 1"),
    (["--lr", "nan"], "--lr: expected a finite number > 0, got 'nan'"),
    (["--lr", "inf"], "--lr: expected a finite number > 0"),
    (["--lr", "-0.1"], "--lr: expected a finite number > 0"),
    (["--seed", "-1"], "--seed: expected an integer >= 0"),
    (["--attn", "nope"], "--attn: invalid choice"),
    (["--schedule", "bogus"], "--schedule 'bogus': schedule: unknown"),
    (["--schedule", "optimal(1)"], "below the minimum feasible peak"),
    (["--bogus"], "unrecognized arguments"),
]


@pytest.mark.parametrize("argv,message", DEMO, ids=[" ".join(c[0]) for c in DEMO])
def test_the_demo_refuses_a_bad_option_in_one_line(argv, message, monkeypatch, capsys, torch):
    from ckptlab.torch import demo
    from ckptlab.torch import dist as cdist

    for module, name in ((demo, "run"), (demo, "train"), (demo, "_torchrun"),
                         (cdist, "spawn")):
        monkeypatch.setattr(module, name, work)
    one_line(demo.main(argv), capsys, message)


def test_the_demo_help_is_help(capsys, torch):
    from ckptlab.torch import demo

    assert demo.main(["--help"]) == 0
    assert "--nproc" in capsys.readouterr().out


@pytest.mark.slow
def test_the_demo_as_a_user_runs_it(torch):
    """`python -m ckptlab.torch.demo --heads 0` in a new process: one line, exit 2."""
    p = subprocess.run([sys.executable, "-m", "ckptlab.torch.demo", "--heads", "0"],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == 2 and p.stdout == "", p.stderr[-2000:]
    assert p.stderr.strip().splitlines() == [
        "error: python -m ckptlab.torch.demo: argument --heads: expected an integer >= 1, "
        "got 0 (see python -m ckptlab.torch.demo --help)"]
