"""The command line end to end on the emulator, with small sizes: every subcommand runs, writes
the files it names (non-empty; PNGs drawn without a display), its numbers agree with hand
computations, and mistakes give one line and a non-zero exit. Under `-m gpu`, the tour on the
CUDA target. The attention bench and fig2: tests/test_cli_attention.py. About 30 s on 2 cores."""

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ckptlab import device, kernels
from ckptlab.cli import main as cli
from ckptlab.cli import report, tour
from ckptlab.measure import roofline

REPO = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
A100 = roofline.SPECS["A100-SXM4-80GB"]


def run_cli(capsys, *argv):
    """main(argv) in this process; (exit status, stdout, stderr)."""
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def run_subprocess(*argv, env=None):
    """`python -m ckptlab ...` as a user types it (no display, the repo on PYTHONPATH)."""
    env = dict(os.environ if env is None else env)
    env.pop("DISPLAY", None)
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "ckptlab", *argv], capture_output=True,
                          text=True, env=env, timeout=120, cwd=REPO)


def written_paths(out: str) -> list[Path]:
    """The paths a command lists after 'wrote'."""
    tail = out.split("\nwrote", 1)[1]
    return [Path(line.strip()) for line in tail.splitlines()[1:] if line.startswith("  ")]


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# ---------------------------------------------------------------- hand computations


def test_check_passes_and_fails(capsys, monkeypatch):
    """`check --quick` passes every kernel; with a dQ one part in 1e4 off it exits 1 and says
    which output failed."""
    rc, out, _ = run_cli(capsys, "check", "--quick")
    assert rc == 0 and "20 of 20 passed" in out
    real = kernels.flash_backward

    def off_by_a_little(*args, **kwargs):
        dq, dk, dv = real(*args, **kwargs)
        return dq * np.float32(1 + 1e-4), dk, dv

    monkeypatch.setattr(kernels, "flash_backward", off_by_a_little)
    rc, out, _ = run_cli(capsys, "check", "--quick")
    assert rc == 1 and "FAIL (dQ)" in out and "12 of 20 passed" in out


@pytest.mark.slow  # the whole tour; CI runs the full tour first
def test_tour_quick_end_to_end(tmp_path):
    """`tour --quick` as a user runs it, in a new process with no display and no MPLBACKEND:
    the three parts print, every file it lists exists and is non-empty, the PNGs are PNGs, and
    the sweep's counted bytes equal the modeled ones row by row."""
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    p = run_subprocess("--device", "emu", "tour", "--quick", "--out", str(tmp_path), env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    for header in ("-- 1. gradient checks", "-- 2. naive -> stored -> flash",
                   "-- 3. checkpoint schedules"):
        assert header in p.stdout
    assert "20 of 20 passed" in p.stdout
    assert "fusion naive/stored" in p.stdout and "recompute stored/flash" in p.stdout
    assert "times modeled (lower-upper: unique-counted bytes)" in p.stdout
    assert "counted and unique bytes == their models (ckptlab.measure.traffic) on every row: yes" \
        in p.stdout
    paths = written_paths(p.stdout)
    names = sorted(path.name for path in paths)
    assert names == sorted([
        "tour_checks.csv", "tour_attention.csv", "tour_decomposition.csv", "tour_checkpoint.csv",
        "attention_memory_vs_n.png", "attention_time_vs_n.png", "attention_roofline.png",
        "attention_memory_vs_speed.png", "attention_bytes_vs_n.png",
        "checkpoint_memory_trace.png", "checkpoint_pareto.png",
        "checkpoint_memory_vs_time.png"])
    for path in paths:
        assert path.parent == tmp_path and path.stat().st_size > 0, path
        if path.suffix == ".png":
            assert path.read_bytes().startswith(PNG_MAGIC) and path.stat().st_size > 10_000
    rows = read_csv(tmp_path / "tour_attention.csv")
    assert sorted({int(r["N"]) for r in rows}) == tour.SIZES["quick"]["ns"]
    assert sorted({r["impl"] for r in rows}) == ["flash", "naive", "stored"]
    for r in rows:
        assert r["bytes_source"] == "counted", r
        assert r["counted_bytes"] == r["modeled_counted_bytes"], r
        assert r["unique_bytes"] == r["modeled_unique_bytes"], r
    ck = read_csv(tmp_path / "tour_checkpoint.csv")
    assert {r["schedule"] for r in ck} >= {"none", "sqrt"}
    assert all(int(r["measured_peak_bytes"]) > 0 for r in ck if r["measured_peak_bytes"])


def test_bench_checkpoint_dispatch(tmp_path, capsys):
    path = tmp_path / "ck.csv"
    rc, out, _ = run_cli(capsys, "bench", "checkpoint", "--layers", "3", "--width", "8",
                         "--batch", "4", "--repeats", "1", "--no-torch", "--schedule",
                         "none,sqrt", "--csv", str(path))
    assert rc == 0 and "sqrt" in out
    assert {r["schedule"] for r in read_csv(path)} >= {"none", "sqrt"}


def test_kernels_and_bench_emu_dispatch(capsys):
    rc, out, _ = run_cli(capsys, "bench", "emu", "--size", "32", "--repeats", "1",
                         "--flash-n", "24", "--flash-repeats", "1")
    assert rc == 0 and "M threads/s" in out
    assert "native g++ -O2" in out and "flash forward + backward, N = 24" in out
    assert "wmma_gemm (bf16)" in out and "MFLOP/s" in out  # the tensor-core table
    rc, out, _ = run_cli(capsys, "kernels", "--help")
    assert rc == 0 and "python -m ckptlab kernels" in out


# ---------------------------------------------------------------- mistakes: one line, non-zero


@pytest.mark.parametrize("argv,message", [
    (["nosuch"], "unknown command 'nosuch'"),
    ([], "a command is required"),
    (["bench"], "expected one of attention, checkpoint, emu"),
    (["bench", "attention", "--bogus"], "unrecognized arguments: --bogus"),
    (["bench", "attention", "--n", "64,x"], "comma-separated integers"),
    (["bench", "attention", "--impl", "fast"], "subset of"),
    (["bench", "attention", "--d", "44"], "invalid choice"),
    (["tour", "--n", "64"], "at least two sizes"),
    (["--device", "tpu", "check"], "unknown target 'tpu'"),
])
def test_mistakes_give_one_line(capsys, argv, message):
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 2 and message in err
    assert len(err.strip().splitlines()) == 1, err


def test_a_size_that_cannot_fit_is_refused_before_allocating(capsys):
    rc, _, err = run_cli(capsys, "bench", "attention", "--n", "200000", "--heads", "16")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert re.search(r"naive attention at B=1 H=16 N=200000 d=64 needs ~\d+\.\d+ GB", err)
    with pytest.raises(report.TooBig, match="available host RAM"):
        report.check_fits("naive", 1, 16, 200000, 64, "emu")


@pytest.mark.skipif(device.cuda_available(), reason="this machine has a GPU")
def test_device_cuda_without_a_gpu_is_a_clear_error():
    """As a user runs it: a new process, one line on stderr, exit 2, nothing on stdout."""
    p = run_subprocess("--device", "cuda", "tour")
    assert p.returncode == 2 and p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1
    assert "target 'cuda' was asked for" in p.stderr and "no CUDA device" in p.stderr


def test_unknown_option_in_a_new_process():
    p = run_subprocess("check", "--fast")
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0
    assert "unrecognized arguments: --fast" in p.stderr


# ---------------------------------------------------------------- the GPU path


@pytest.mark.gpu
def test_tour_on_the_gpu(tmp_path, capsys):
    """`tour --quick` on CUDA: the gradient checks pass there, the sweep's times are measured
    with CUDA events, its bytes are labelled modeled, and every file is written."""
    rc, out, err = run_cli(capsys, "--device", "cuda", "tour", "--quick", "--out", str(tmp_path))
    assert rc == 0, err[-2000:]
    assert "on target 'cuda'" in out and "12 of 12 passed" in out
    for path in written_paths(out):
        assert path.stat().st_size > 0, path
    for r in read_csv(tmp_path / "tour_attention.csv"):
        assert r["target"] == "cuda" and r["bytes_source"] == "modeled"
        assert r["time_source"].startswith("measured (cuda: ") and float(r["time_s"]) > 0
