"""`bench attention`, `fig2` and the tour's attention part on the emulator, small sizes: the three
methods' counted and unique bytes, FLOPs and saved bytes against hand computations; the modeled
times are the time model's and bracket; the decomposition multiplies out; figures are written.
Under `-m gpu`, the attention bench on the CUDA target."""

import csv
import io

import pytest

from ckptlab.cli import attention_figures, bench_attention, fig2, tour
from ckptlab.cli import main as cli
from ckptlab.measure import roofline, timemodel

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_cli(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def naive_bytes_by_hand(N: int, d: int, T: int = 16) -> int:
    """Counted global bytes of the eight naive launches for B = H = 1, Nq = Nk = N, written out
    here independently of ckptlab.measure.traffic: a T x T tiled matmul C (M x n) = A (M x K)
    B (K x n) reads A ceil(n/T) times, B ceil(M/T) times, writes C once; the softmax kernels read
    their N x N inputs twice (max pass, sum pass) and write once."""
    c, cd = -(-N // T), -(-d // T)
    nn, nd = N * N, N * d
    scores = nd * c + nd * c + nn  # Q, K, S
    softmax = 2 * nn + nn  # S twice, P
    pv = nn * cd + nd * c + nd  # P, V, O
    bwd_dv = nn * cd + nd * c + nd  # P, dO, dV
    bwd_dp = nd * c + nd * c + nn  # dO, V, dP
    bwd_ds = 2 * nn + 2 * nn + nn  # P twice, dP twice, dS
    bwd_dq = nn * cd + nd * c + nd  # dS, K, dQ
    bwd_dk = nn * cd + nd * c + nd  # dS, Q, dK
    return 4 * (scores + softmax + pv + bwd_dv + bwd_dp + bwd_ds + bwd_dq + bwd_dk)


def naive_unique_by_hand(N: int, d: int) -> int:
    """Distinct bytes each naive launch touches, summed: every launch touches each of its N x N
    arguments once (S twice: scores writes it, softmax reads it; P four times; dP twice; dS three
    times: 11 N^2) and each (N, d) operand once (12 N d)."""
    return 4 * (11 * N * N + 12 * N * d)


def test_bench_attention_three_methods_by_hand(capsys):
    """`bench attention --csv -`: the CSV alone on stdout, the table on stderr. At N = 64, d = 64
    (tiles divide N: no padding): naive's counted and unique bytes and FLOPs by hand; stored
    holds S (N x N) besides O and L and moves it twice (written, read back); flash holds O and L
    and recomputes S (2 d N^2 FLOPs). Times are the time model's, lower <= upper."""
    rc, out, err = run_cli(capsys, "--device", "emu", "bench", "attention", "--n", "64,48",
                           "--d", "64", "--csv", "-")
    assert rc == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["impl"], int(r["N"])) for r in rows] == [
        (m, n) for n in (64, 48) for m in ("naive", "stored", "flash")]
    assert "A100 modeled" in err and "recompute stored/flash" in err and "unique" in err
    assert bench_attention.BYTES_NOTE in err
    naive, stored, flash = rows[:3]
    N = d = 64
    nn, nd = N * N, N * d
    assert int(naive["hardware_flops"]) == int(naive["model_flops"]) == 12 * nn * d
    assert int(stored["hardware_flops"]) == 12 * nn * d  # no recompute
    assert int(flash["hardware_flops"]) == 14 * nn * d == int(flash["model_flops"]) + 2 * nn * d
    assert int(naive["counted_bytes"]) == naive_bytes_by_hand(N, d) == 1015808
    assert int(naive["unique_bytes"]) == naive_unique_by_hand(N, d)
    assert int(stored["counted_bytes"]) - int(flash["counted_bytes"]) == 2 * 4 * nn
    assert int(naive["saved_bytes"]) == 4 * nn  # P
    assert int(stored["saved_bytes"]) == 4 * (nn + nd + N)  # S, O, L
    assert int(flash["saved_bytes"]) == 4 * (nd + N)  # O, L
    for r in rows:
        assert r["bytes_source"] == "counted"
        assert r["counted_bytes"] == r["modeled_counted_bytes"], r
        assert r["unique_bytes"] == r["modeled_unique_bytes"], r
        assert int(r["unique_bytes"]) <= int(r["counted_bytes"])
        for gpu in ("A100", "H200"):
            lo, hi = float(r[f"{gpu}_lo_s"]), float(r[f"{gpu}_hi_s"])
            want = timemodel.method_time(r["impl"], 1, 1, int(r["N"]), int(r["N"]), d, gpu)
            assert (lo, hi) == pytest.approx((want.lower, want.upper), rel=1e-12)
            assert int(r["launches"]) * timemodel.LAUNCH_S <= lo <= hi


def test_decomposition_rows_multiply_out():
    rows = bench_attention.sweep([32], B=1, H=2, d=16, progress=False)
    gains = bench_attention.decompose(rows)
    assert {g["quantity"] for g in gains} >= {"counted bytes", "unique bytes",
                                              "saved for backward", "A100 modeled time, lower"}
    for g in gains:
        assert g["fusion"] * g["recompute"] == pytest.approx(g["product"], rel=1e-12)
        assert g["product"] == pytest.approx(g["naive"] / g["flash"], rel=1e-12)


def test_bench_attention_causal_deterministic_odd_and_figures(tmp_path, capsys):
    """Causal, deterministic dQ, odd N, a padded head dim (d = 40 runs on 64-wide tiles): counted
    and unique bytes equal their models; recompute FLOPs: none in naive, dP = dO V^T again in
    stored's atomic-free dQ kernel, and S besides in flash's; --png writes the memory-against-
    speed figure and the bytes-against-N one."""
    path, png = tmp_path / "b.csv", tmp_path / "figures"
    rc, out, _ = run_cli(capsys, "bench", "attention", "--n", "33,65", "--d", "40", "--causal",
                         "--deterministic", "--csv", str(path), "--png", str(png))
    assert rc == 0 and "N method" in out and "wrote" in out
    rows = read_csv(path)
    assert len(rows) == 6 and all(r["causal"] == r["deterministic"] == "True" for r in rows)
    for r in rows:
        assert r["counted_bytes"] == r["modeled_counted_bytes"], r
        assert r["unique_bytes"] == r["modeled_unique_bytes"], r
    for n in ("33", "65"):
        re = {r["impl"]: int(r["recompute_flops"]) for r in rows if r["N"] == n}
        assert re["naive"] == 0 < re["stored"] < re["flash"], re
    for name in attention_figures.FIGURES:
        p = png / name
        assert p.read_bytes().startswith(PNG_MAGIC) and p.stat().st_size > 10_000


def test_png_is_a_folder_for_both_benches(tmp_path, capsys, monkeypatch):
    """`--png` means the same for bench attention and bench checkpoint: a folder, the current one
    when bare (bench attention took a file, bench checkpoint a folder)."""
    monkeypatch.chdir(tmp_path)
    rc, out, _ = run_cli(capsys, "bench", "attention", "--n", "32", "--d", "32", "--impl",
                         "flash,stored", "--png")
    assert rc == 0 and "wrote attention_memory_vs_speed.png" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(attention_figures.FIGURES)
    rc, out, _ = run_cli(capsys, "bench", "checkpoint", "--layers", "2", "--width", "8",
                         "--batch", "4", "--no-torch", "--repeats", "1", "--schedule",
                         "none,sqrt", "--png", "ck")
    assert rc == 0 and sorted(p.name for p in (tmp_path / "ck").iterdir()) == [
        "checkpoint_memory_vs_time.png", "checkpoint_pareto.png"]
    (tmp_path / "afile").write_text("x")
    for bench in ("attention", "checkpoint"):  # a file is refused the same way, before work
        rc, _, err = run_cli(capsys, "bench", bench, "--png", "afile")
        assert rc == 2 and "--png afile: exists and is not a folder" in err, err


def test_fig2_three_methods_counted_on_one_head(tmp_path, capsys, monkeypatch):
    """fig2 with N shrunk to 64 (the full N = 1024 takes ~15 s): bytes counted on one head times
    B*H, labelled so; stored moves N x N data and flash none; the paper's numbers alongside with
    the FLOP correction and its source; unique bytes below counted."""
    monkeypatch.setattr(fig2, "N", 64)
    rc, out, _ = run_cli(capsys, "fig2", "--out", str(tmp_path))
    assert rc == 0
    assert "counted on 1 head at N=64, x B*H=1024" in out and "ms, modeled A100 fp32" in out
    assert "flash-attention/issues/741" in out and "the factor H = 16 is missing" in out
    assert "unstated" not in out
    rows = {r["method"]: r for r in read_csv(tmp_path / "fig2.csv")}
    assert list(rows) == ["standard", "stored", "flash"]
    one = {m: fig2.count_one_head(m, 64)["bytes"] for m in ("naive", "flash")}
    assert one["naive"] == naive_bytes_by_hand(64, 64)
    assert float(rows["standard"]["counted_gb"]) * 1e9 == pytest.approx(1024 * one["naive"])
    assert float(rows["flash"]["counted_gb"]) * 1e9 == pytest.approx(1024 * one["flash"])
    assert float(rows["flash"]["nn_gb"]) == 0 < float(rows["stored"]["nn_gb"])
    for r in rows.values():
        assert float(r["unique_gb"]) <= float(r["counted_gb"])
        assert float(r["unique_fp16_gb"]) < float(r["unique_gb"])
        assert float(r["modeled_fp32_lo_ms"]) <= float(r["modeled_fp32_hi_ms"])
    assert float(rows["standard"]["paper_ms"]) == 41.7
    assert float(rows["flash"]["paper_hbm_gb"]) == 4.4


def test_fig2_paper_numbers_on_the_roofline():
    """The published GFLOPs are one head's, and the paper's own numbers give 6.4x on the A100
    fp16 roofline (computed by hand in tests/test_roofline.py)."""
    assert fig2.published_gflops("standard") == pytest.approx(66.6, abs=0.05)
    assert fig2.published_gflops("flash") == pytest.approx(75.2, abs=0.05)
    p = fig2.paper_roofline()
    assert p["standard"][1] == "memory" and p["flash"][1] == "compute"
    assert p["speedup"] == pytest.approx(6.40, abs=0.01)


def test_roofline_placement_by_hand():
    """The tour's roofline point for naive at N = 64 sits at intensity FLOPs / counted bytes
    computed by hand, below the A100 fp32 ridge 19.5e12 / 2.039e12 = 9.56 FLOP/byte; stored and
    flash sit above it."""
    rows = bench_attention.sweep([48, 64], progress=False)
    points = {p["name"]: p for p in tour.roofline_points(rows)}
    naive = points["naive (8 kernels)"]
    stored, flash = points["stored (3 kernels)"], points["flash (3 kernels)"]
    assert naive["flops"] == 12 * 64**3 and naive["bytes"] == naive_bytes_by_hand(64, 64)
    ridge = 19.5e12 / 2.039e12
    assert roofline.ridge_point("a100") == pytest.approx(ridge)
    assert naive["flops"] / naive["bytes"] == pytest.approx(3145728 / 1015808)
    assert naive["flops"] / naive["bytes"] < ridge
    assert stored["flops"] / stored["bytes"] > ridge and flash["flops"] / flash["bytes"] > ridge
    title = tour.roofline_title(list(points.values()), "A100-SXM4-80GB", 64)
    assert title.endswith("9.56 FLOP/byte): naive")


@pytest.mark.gpu
def test_bench_attention_on_the_gpu(capsys):
    """On CUDA: times are measured (CUDA events) with their spread, bytes modeled, the CuPy pool
    peak recorded, and the modeled times stand beside."""
    rc, out, _ = run_cli(capsys, "--device", "cuda", "bench", "attention", "--n", "64,128",
                         "--repeats", "3", "--csv", "-")
    assert rc == 0
    for r in csv.DictReader(io.StringIO(out)):
        assert r["target"] == "cuda" and r["bytes_source"] == "modeled"
        assert r["time_source"].startswith("measured (cuda: ") and float(r["time_s"]) > 0
        assert float(r["time_p10_s"]) <= float(r["time_s"]) <= float(r["time_p90_s"])
        assert int(r["alloc_peak_bytes"]) >= int(r["saved_bytes"]) > 0
        assert float(r["A100_lo_s"]) <= float(r["A100_hi_s"])
