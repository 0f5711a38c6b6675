"""The command line end to end on the emulator, with small sizes: every subcommand runs, writes
the files it names (non-empty; PNGs drawn without a display), its numbers agree with hand
computations, and mistakes give one line and a non-zero exit. Under `-m gpu`, the tour and the
attention bench on the CUDA target. About 30 s on 2 cores."""

import csv
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ckptlab import device, kernels
from ckptlab.cli import bench_attention, fig2, report, tour
from ckptlab.cli import main as cli
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


def naive_bytes_by_hand(N: int, d: int, T: int = 16) -> int:
    """Global bytes of the eight naive launches for B = H = 1, Nq = Nk = N, written out here
    independently of ckptlab.measure.traffic: a T x T tiled matmul C (M x n) = A (M x K) B (K x n)
    reads A ceil(n/T) times, B ceil(M/T) times, writes C once; the softmax kernels read their N x N
    inputs twice (max pass, sum pass) and write once."""
    c = -(-N // T)
    cd = -(-d // T)
    nn, nd = N * N, N * d
    scores = nd * c + nd * c + nn  # Q, K, S
    softmax = 2 * nn + nn  # S twice, P
    pv = nn * cd + nd * c + nd  # P, V, O
    bwd_dv = nn * cd + nd * c + nd  # P, dO, dV
    bwd_dp = nd * c + nd * c + nn  # dO, V, dP
    bwd_ds = 2 * nn + 2 * nn + nn  # P twice, dP twice, dS
    bwd_dq = nn * cd + nd * c + nd  # dS, K, dQ
    bwd_dk = nn * cd + nd * c + nd  # dS, Q, dK
    floats = scores + softmax + pv + bwd_dv + bwd_dp + bwd_ds + bwd_dq + bwd_dk
    return 4 * floats


def flash_bytes_by_hand(N: int, d: int, fwd=(64, 32), bwd=(32, 32)) -> int:
    """Global bytes of the flash forward and its atomic-dQ backward for B = H = 1, Nq = Nk = N,
    non-causal, N a multiple of the tiles, from the kernels' header comments (not from
    ckptlab.measure.traffic): the forward reads Q once and K, V once per query tile, writes O
    and L; the backward's preprocess reads O, dO, writes D and zeroes dQ; dkdv reads K, V once,
    Q, dO (Br x d) and L, D (Br) for every (Q tile, K/V tile) pair, writes dK, dV, and adds
    Br x d atomics (4 bytes each) into dQ per pair."""
    nd, Tr_f = N * d, -(-N // fwd[0])
    forward = nd + Tr_f * 2 * nd + nd + N  # Q, K and V per query tile, O, L
    Br, Bc = bwd
    pairs = -(-N // Br) * -(-N // Bc)
    preprocess = 2 * nd + N + nd  # O, dO, D, dQ = 0
    dkdv = 2 * nd + pairs * (2 * Br * d + 2 * Br) + 2 * nd + pairs * Br * d
    return 4 * (forward + preprocess + dkdv)


def test_bench_attention_csv_matches_hand_computation(capsys):
    """`bench attention --csv -`: stdout is the CSV alone; for naive and flash at N = 64,
    d = 64 the counted bytes, FLOPs, saved bytes, the modeled A100 times and their ratio equal
    the hand computations."""
    rc, out, err = run_cli(capsys, "--device", "emu", "bench", "attention", "--n", "64,48",
                           "--d", "64", "--impl", "naive,flash", "--csv", "-")
    assert rc == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["impl"], int(r["N"])) for r in rows] == [
        ("naive", 64), ("flash", 64), ("naive", 48), ("flash", 48)]
    assert "modeled (A100)" in err  # the table went to stderr
    naive = rows[0]
    N = d = 64
    flops = 2 * N * N * d * 2 + 2 * N * N * d * 4  # fwd: Q K^T, P V; bwd: dV, dP, dQ, dK
    nbytes = naive_bytes_by_hand(N, d)
    assert int(naive["hardware_flops"]) == int(naive["model_flops"]) == flops
    assert int(naive["hbm_bytes"]) == nbytes == 1015808 and naive["hbm_source"] == "counted"
    assert int(naive["saved_bytes"]) == 4 * N * N  # P
    t = max(flops / A100["fp32_flops"], nbytes / A100["hbm_bytes_per_s"])  # roofline
    assert float(naive["time_s"]) == pytest.approx(t, rel=1e-12)
    assert naive["modeled_bound"] == "memory"  # intensity 3.10 < A100 fp32 ridge 19.5/2.039
    assert naive["time_source"] == "modeled (A100-SXM4-80GB, fp32 roofline)"
    flash = rows[1]
    assert (kernels.FWD_TILES[d], kernels.BWD_TILES[d]) == ((64, 32), (32, 32))  # the tiles below
    fflops = flops + 2 * N * N * d  # the backward recomputes S = Q K^T
    fbytes = flash_bytes_by_hand(N, d)
    assert int(flash["model_flops"]) == flops and int(flash["hardware_flops"]) == fflops
    assert int(flash["hbm_bytes"]) == fbytes == 280064 and flash["hbm_source"] == "counted"
    assert int(flash["saved_bytes"]) == 4 * (N * d + N)  # O and L
    assert float(flash["memory_ratio"]) == pytest.approx(N * N / (N * d + N))
    tf = max(fflops / A100["fp32_flops"], fbytes / A100["hbm_bytes_per_s"])
    assert float(flash["time_s"]) == pytest.approx(tf, rel=1e-12)
    assert float(flash["speedup"]) == pytest.approx(t / tf, rel=1e-12)
    for r in rows:
        assert r["hbm_bytes"] == r["modeled_bytes"], r


def test_bench_attention_causal_and_deterministic_rows(tmp_path, capsys):
    """Causal, flash-det, odd N, d = 32: counted == modeled, recompute FLOPs reported, CSV file and
    the bytes-by-source figure written."""
    path, png = tmp_path / "b.csv", tmp_path / "b.png"
    rc, out, _ = run_cli(capsys, "bench", "attention", "--n", "33,65", "--d", "32", "--causal",
                         "--impl", "flash,flash-det,naive", "--csv", str(path), "--png", str(png))
    assert rc == 0 and "N method" in out
    rows = read_csv(path)
    assert len(rows) == 6 and all(r["causal"] == "True" for r in rows)
    for r in rows:
        assert r["hbm_bytes"] == r["modeled_bytes"], r
        recompute = int(r["recompute_flops"])
        assert (recompute == 0) if r["impl"] == "naive" else recompute > 0
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_check_passes_and_fails(capsys, monkeypatch):
    """`check --quick` passes every kernel; with a dQ one part in 1e4 off it exits 1 and says
    which output failed."""
    rc, out, _ = run_cli(capsys, "check", "--quick")
    assert rc == 0 and "12 of 12 passed" in out
    real = kernels.flash_backward

    def off_by_a_little(*args, **kwargs):
        dq, dk, dv = real(*args, **kwargs)
        return dq * np.float32(1 + 1e-4), dk, dv

    monkeypatch.setattr(kernels, "flash_backward", off_by_a_little)
    rc, out, _ = run_cli(capsys, "check", "--quick")
    assert rc == 1 and "FAIL (dQ)" in out and "4 of 12 passed" in out


def test_fig2_counts_one_head_and_scales(tmp_path, capsys, monkeypatch):
    """fig2 with N shrunk to 64 (the full N = 1024 takes ~13 s): bytes counted on one head times
    B*H, labelled so, with the paper's numbers alongside."""
    monkeypatch.setattr(fig2, "N", 64)
    rc, out, _ = run_cli(capsys, "fig2", "--out", str(tmp_path))
    assert rc == 0
    assert "counted on 1 head at N=64, x B*H=1024" in out and "ms, modeled A100 fp32" in out
    rows = read_csv(tmp_path / "fig2.csv")
    assert float(rows[0]["hbm_gb"]) * 1e9 == pytest.approx(1024 * naive_bytes_by_hand(64, 64))
    assert float(rows[1]["hbm_gb"]) * 1e9 == pytest.approx(1024 * flash_bytes_by_hand(64, 64))
    assert float(rows[1]["nn_gb"]) == 0 and float(rows[0]["nn_gb"]) > 0
    assert float(rows[0]["paper_ms"]) == 41.7 and float(rows[1]["paper_hbm_gb"]) == 4.4


def test_tour_quick_end_to_end(tmp_path):
    """`tour --quick` as a user runs it, in a new process with no display and no MPLBACKEND:
    the three parts print, every file it lists exists and is non-empty, the PNGs are PNGs, and
    the sweep's counted bytes equal the modeled ones row by row."""
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    p = run_subprocess("--device", "emu", "tour", "--quick", "--out", str(tmp_path), env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    for header in ("-- 1. gradient checks", "-- 2. store P (naive) vs recompute P (flash)",
                   "-- 3. checkpoint schedules"):
        assert header in p.stdout
    assert "12 of 12 passed" in p.stdout
    assert "time: modeled (A100-SXM4-80GB, fp32 roofline)" in p.stdout
    assert "counted bytes == modeled bytes (ckptlab.measure.traffic) on every row: yes" in p.stdout
    paths = written_paths(p.stdout)
    names = sorted(path.name for path in paths)
    assert names == sorted([
        "tour_checks.csv", "tour_attention.csv", "tour_checkpoint.csv",
        "attention_memory_vs_n.png", "attention_time_vs_n.png", "attention_hbm_bytes_vs_n.png",
        "attention_roofline.png", "checkpoint_memory_trace.png", "checkpoint_pareto.png"])
    for path in paths:
        assert path.parent == tmp_path and path.stat().st_size > 0, path
        if path.suffix == ".png":
            assert path.read_bytes().startswith(PNG_MAGIC) and path.stat().st_size > 10_000
    rows = read_csv(tmp_path / "tour_attention.csv")
    assert sorted({int(r["N"]) for r in rows}) == tour.SIZES["quick"]["ns"]
    for r in rows:
        assert r["hbm_source"] == "counted" and r["hbm_bytes"] == r["modeled_bytes"], r
    ck = read_csv(tmp_path / "tour_checkpoint.csv")
    assert {r["schedule"] for r in ck} >= {"none", "sqrt"}
    assert all(int(r["measured_peak_bytes"]) > 0 for r in ck if r["measured_peak_bytes"])


def test_roofline_placement_by_hand():
    """The tour's roofline point for naive at N = 64 sits at intensity FLOPs / bytes computed by
    hand, below the A100 fp32 ridge 19.5e12 / 2.039e12 = 9.56 FLOP/byte; flash sits above it."""
    rows = bench_attention.sweep([48, 64], progress=False)
    points = {p["name"]: p for p in tour.roofline_points(rows)}
    naive, flash = points["naive (8 kernels)"], points["flash (3 kernels)"]
    assert naive["flops"] == 12 * 64**3 and naive["bytes"] == naive_bytes_by_hand(64, 64)
    ridge = 19.5e12 / 2.039e12
    assert roofline.ridge_point("a100") == pytest.approx(ridge)
    assert naive["flops"] / naive["bytes"] == pytest.approx(3145728 / 1015808)
    assert naive["flops"] / naive["bytes"] < ridge
    assert flash["flops"] == 14 * 64**3 and flash["bytes"] == flash_bytes_by_hand(64, 64)
    assert flash["flops"] / flash["bytes"] > ridge
    title = tour.roofline_title(list(points.values()), "A100-SXM4-80GB", 64)
    assert title.endswith("9.56 FLOP/byte): naive")


def test_bench_checkpoint_dispatch(tmp_path, capsys):
    path = tmp_path / "ck.csv"
    rc, out, _ = run_cli(capsys, "bench", "checkpoint", "--layers", "3", "--width", "8",
                         "--batch", "4", "--repeats", "1", "--no-torch", "--schedule",
                         "none,sqrt", "--csv", str(path))
    assert rc == 0 and "sqrt" in out
    assert {r["schedule"] for r in read_csv(path)} >= {"none", "sqrt"}


def test_kernels_and_bench_emu_dispatch(capsys):
    rc, out, _ = run_cli(capsys, "bench", "emu", "--size", "32", "--repeats", "1")
    assert rc == 0 and "M threads/s" in out
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
    (["bench", "attention", "--d", "48"], "invalid choice"),
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
        assert r["target"] == "cuda" and r["hbm_source"] == "modeled"
        assert r["time_source"].startswith("measured (cuda: ") and float(r["time_s"]) > 0


@pytest.mark.gpu
def test_bench_attention_on_the_gpu(capsys):
    """On CUDA: times are measured (CUDA events), bytes modeled, the CuPy pool peak recorded."""
    rc, out, _ = run_cli(capsys, "--device", "cuda", "bench", "attention", "--n", "64,128",
                         "--repeats", "3", "--csv", "-")
    assert rc == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    for r in rows:
        assert r["target"] == "cuda" and r["hbm_source"] == "modeled"
        assert r["time_source"].startswith("measured (cuda: ") and float(r["time_s"]) > 0
        assert int(r["alloc_peak_bytes"]) >= int(r["saved_bytes"]) > 0
