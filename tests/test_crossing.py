"""When recompute stops paying: the rule of thumb by hand, the modeled gains against it, the
three methods' decomposition, and `bench crossing` as a user runs it."""

import pytest

from ckptlab.cli import main as cli
from ckptlab.kernels import archs
from ckptlab.measure import crossing, roofline, timemodel, traffic, whatif

SIZE = dict(N=4096, B=1, H=16)


def test_rule_of_thumb_by_hand():
    # Per pair, in units of 1 / peak: flash 14 d; stored max(4 d, 4 R) + max(8 d, 4 R) (its
    # forward writes 4 bytes of fp32 S, its dK/dV kernel reads them; in bf16 too, the
    # tensor-core stored kernel keeps S in fp32). For R/2 < d < R: 4 R + 8 d > 14 d while
    # d < 2 R / 3. One roofline over everything (perfect overlap): 8 R > 14 d, d < 4 R / 7.
    # A100 fp32, R = 19.5e12 / 2.039e12 = 9.5635; H200 bf16, R = 989.5e12 / 4.8e12 = 206.15.
    assert crossing.rule_of_thumb("a100", "fp32") == pytest.approx(2 * 9.56351 / 3, rel=1e-5)
    assert crossing.rule_of_thumb("h200", "bf16") == pytest.approx(2 * 206.146 / 3, rel=1e-5)
    assert crossing.rule_of_thumb("h200", "bf16", overlap=True) == pytest.approx(
        4 * 206.146 / 7, rel=1e-5)
    # deterministic dQ: S read again (12 bytes), 18 d FLOPs: 2 R / 3 in both forms
    for overlap in (False, True):
        assert crossing.rule_of_thumb("h200", "bf16", deterministic=True,
                                       overlap=overlap) == pytest.approx(2 * 206.146 / 3, rel=1e-5)
    # a 16-bit P (what-if): 2 + 2 bytes, max(4 d, 2 R) + max(8 d, 2 R): d < R / 3; 51 on an A100
    assert crossing.rule_of_thumb("a100", "bf16", score_bytes=2) == pytest.approx(
        312e12 / 2039e9 / 3, rel=1e-5)
    assert crossing.rule_fraction("bf16", overlap=True, score_bytes=2) == pytest.approx(2 / 7)
    for dtype in ("fp32", "bf16"):
        assert crossing.per_pair(dtype) == dict(s_bytes=8, stored_flops_per_d=12,
                                                 flash_flops_per_d=14)
        assert crossing.stored_launches_per_pair(dtype) == [(4, 4), (8, 4)]


def test_crossing_fraction_solves_the_sum_of_maxima():
    """The root of sum max(f_i c, s_i) = F c, checked against a fine scan of the two sides."""
    for launches, F in [([(4, 4), (8, 4)], 14), ([(4, 4), (6, 4), (4, 4)], 18),
                        ([(1, 3), (5, 0.5), (2, 2)], 11), ([(3, 1)], 5)]:
        c = crossing.crossing_fraction(launches, F)
        def side(x, launches=launches, F=F):
            return sum(max(f * x, s) for f, s in launches) - F * x

        assert side(c) == pytest.approx(0, abs=1e-12)
        assert side(c * 0.999) > 0 > side(c * 1.001)
    assert crossing.crossing_fraction([(8, 4), (6, 4)], 14) == float("inf")


def rules_agree_with_the_sweep(gpus, ds):
    """Every swept d below the printed rule (2 R / 3) has a modeled gain above 1 at the
    unique-bytes bound, every d above it a gain below 1; the same for the 16-bit-P what-if
    against its rule, R / 3."""
    rows = whatif.add_p16_gains(crossing.recompute_gains(gpus, ["fp32", "bf16"], ds, **SIZE))
    assert {(r["gpu"], r["dtype"]) for r in rows} == {  # no rows where a GPU lacks the dtype
        (roofline.spec(g)["name"], t) for g in gpus for t in ("fp32", "bf16")
        if not archs.dtype_refusal(t, roofline.spec(g)["arch"])}
    for r in rows:
        pays = r["gain_unique"] > 1
        assert pays == (r["d"] < r["rule_of_thumb_d"]), (
            r["gpu"], r["dtype"], r["d"], r["rule_of_thumb_d"], r["gain_unique"])
        assert (r["gain_p16_unique"] > 1) == (r["d"] < r["rule_p16_d"]), (
            r["gpu"], r["dtype"], r["d"], r["rule_p16_d"], r["gain_p16_unique"])


def test_the_rule_is_the_models_on_an_a100_and_h200():
    """d = 96 in bf16 on an A100 lies between 4 R / 7 = 87 and 2 R / 3 = 102: the model says
    recompute pays there (gain 1.07), as the per-launch rule does and the whole-roofline rule
    does not; likewise d = 128 on an H200 (118 < 128 < 137)."""
    rules_agree_with_the_sweep(["a100", "h200"], [64, 96, 128])


def test_p16_what_if_halves_only_the_bytes_of_s():
    """The what-if moves 2 bytes a score of S where stored moves 4: unique bytes fall by exactly
    4 B H N^2 (S written once, read once), FLOPs and launches unchanged."""
    N, d = 256, 64
    st = timemodel.method_time("stored", 1, 2, N, N, d, "a100", dtype="bf16")
    p16 = whatif.stored_p16_time(1, 2, N, N, d, "a100", dtype="bf16")
    assert p16.what_if and "what-if" in p16.kernels
    assert [x.flops for x in p16.launches["unique"]] == [x.flops for x in st.launches["unique"]]
    saved = sum(x.bytes for x in st.launches["unique"]) - sum(x.bytes
                                                               for x in p16.launches["unique"])
    assert saved == 2 * 2 * N * N * 2


@pytest.mark.slow
def test_the_rule_agrees_with_the_crossing_sweep_everywhere():
    """The printed rule against `bench crossing`'s default sweep on every GPU it covers."""
    from ckptlab.cli import bench_crossing

    rules_agree_with_the_sweep(list(roofline.SPECS), list(bench_crossing.DEFAULT_DIMS))


def test_crossings_pick_the_first_d_below_one():
    rows = [dict(gpu="g", dtype="fp32", d=d, gain_unique=u, gain_counted=c)
            for d, u, c in [(16, 1.5, 2.0), (64, 0.9, 1.1), (32, 1.2, 0.95), (128, 0.8, 1.2)]]
    assert crossing.crossings(rows) == {("g", "fp32"): 64}
    assert crossing.crossings(rows, "gain_counted") == {("g", "fp32"): 32}
    never = [dict(r, gain_unique=2.0) for r in rows]
    assert crossing.crossings(never) == {("g", "fp32"): None}


def test_decomposition_multiplies_out():
    g = timemodel.decomposition({"naive": 12.0, "stored": 3.0, "flash": 4.0})
    assert (g["fusion"], g["recompute"], g["product"]) == (4.0, 0.75, 3.0)
    with pytest.raises(ValueError, match="missing"):
        timemodel.decomposition({"naive": 1.0, "flash": 1.0})


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_modeled_times_decompose_and_bracket(dtype):
    """At N = 1024, d = 64, B = H = 1 on an H200: each method's lower bound (unique bytes) is at
    most its upper (counted), both at least one launch cost per launch; the time gains multiply
    out to naive / flash; flash's and stored's FLOPs differ by exactly the recompute."""
    t = {m: timemodel.method_time(m, 1, 1, 1024, 1024, 64, "h200", dtype=dtype)
         for m in timemodel.CHAIN}
    for m, mt in t.items():
        n_launches = len(traffic.launches(m, 1, 1, 1024, 1024, 64))
        assert n_launches * timemodel.LAUNCH_S <= mt.lower <= mt.upper, m
        assert all(x.source == "modeled" for x in mt.launches["counted"])
    for bound in ("lower", "upper"):
        v = {m: getattr(t[m], bound) for m in t}
        g = timemodel.decomposition(v)
        assert g["fusion"] * g["recompute"] == pytest.approx(g["product"], rel=1e-12)
        assert g["product"] == pytest.approx(v["naive"] / v["flash"], rel=1e-12)
    fl = traffic.totals(traffic.launches("flash", 1, 1, 1024, 1024, 64))
    st = traffic.totals(traffic.launches("stored", 1, 1, 1024, 1024, 64))
    assert fl["flops"] - st["flops"] == fl["recompute_flops"] == 2 * 64 * 1024**2


def test_fp32_is_compute_bound_so_recompute_costs_on_an_a100():
    """Past the rule's d (6.4 on an A100 in fp32) both methods are compute-bound at large N and
    the gain tends to 12 d / 14 d = 0.857 at the unique-bytes bound."""
    rows = crossing.recompute_gains(["a100"], ["fp32"], [64], **SIZE)
    assert rows[0]["gain_unique"] == pytest.approx(12 / 14, abs=0.02)
    assert rows[0]["source"] == "modeled"


def test_bench_crossing_reports_the_crossing(capsys):
    rc = cli.main(["bench", "crossing", "--gpus", "a100,h200", "--d", "16,64"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "A100-SXM4-80GB  fp32" in out and "H200-SXM-141GB  bf16" in out
    assert "first at d =" in out and "recompute pays on" in out and "modeled" in out
    rc = cli.main(["bench", "crossing", "--d", "44"])
    assert rc == 2 and "head dims" in capsys.readouterr().err
    rc = cli.main(["bench", "crossing", "--dtype", "fp8"])
    assert rc == 2 and "--dtype" in capsys.readouterr().err
    assert roofline.ridge_point("h200", "bf16") > roofline.ridge_point("a100", "bf16")


@pytest.mark.gpu
def test_bench_crossing_measures_on_the_gpu(tmp_path, capsys):
    """On CUDA: stored and flash are timed at each d and the measured gain printed beside the
    model's for this GPU; the CSV holds both kinds of rows."""
    path = tmp_path / "c.csv"
    rc = cli.main(["--device", "cuda", "bench", "crossing", "--measure", "--d", "16,64",
                   "--n", "1024", "--gpus", "h200", "--dtype", "fp32", "--csv", str(path)])
    out = capsys.readouterr().out
    assert rc == 0 and "measured here" in out and "gain" in out
    import csv

    rows = list(csv.DictReader(open(path)))
    measured = [r for r in rows if r.get("gain_measured")]
    assert [int(r["d"]) for r in measured] == [16, 64]
    assert all(float(r["gain_measured"]) > 0 for r in measured)


def test_unique_bytes_bound_holds_once_s_exceeds_the_l2():
    # S = 4 B H N^2 bytes (fp32): A100 L2 40 MiB -> 16 MiB at N = 2048 fits, 64 MiB at 4096 does
    # not; RTX 4090 72 MiB -> 64 MiB at 4096 fits, 256 MiB at 8192 does not; B H = 16 -> 1024
    assert timemodel.s_exceeds_l2_from("a100") == 4096
    assert timemodel.s_exceeds_l2_from("rtx-4090") == 8192
    assert timemodel.s_exceeds_l2_from("a100", B=1, H=16) == 1024


@pytest.mark.parametrize("bad", [dict(B=0), dict(H=0), dict(B=-1), dict(score_bytes=0),
                                 dict(score_bytes=-4), dict(score_bytes=float("nan")),
                                 dict(B=2.5), dict(H=True), dict(score_bytes="4")])
def test_s_exceeds_l2_from_refuses_what_would_never_end(bad):
    """B, H or the bytes of a score at 0 (or below, or NaN) would keep S at 0 bytes for every N:
    a ValueError (TypeError for a non-number) with what was expected, not a loop forever."""
    with pytest.raises((ValueError, TypeError), match="expected"):
        timemodel.s_exceeds_l2_from("a100", **bad)


def test_bench_crossing_skips_the_head_dim_an_arch_cannot_run_not_the_dtype(tmp_path, capsys):
    """fp16 on a T4 runs at d = 64, not at d = 256 (the dK/dV tiles need 85504 bytes of shared
    memory, sm_75 allows 65536): the sweep models the first, skips the second and says why; the
    A100 runs both."""
    path = tmp_path / "x.csv"
    argv = ["bench", "crossing", "--gpus", "T4,A100", "--dtype", "fp16", "--d", "64,256", "--n",
            "256", "--csv", str(path)]
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    assert rc == 0 and err == "", err
    assert ("T4 fp16 d=256: skipped (not modeled), attn_flash_bwd_dkdv_tc: needs 85504 bytes of "
            "shared memory per block; sm_75 allows at most 65536") in out
    t4 = next(line for line in out.splitlines() if line.startswith("T4 "))
    assert "skipped" in t4 and "none up to d = 64" in t4
    import csv

    rows = list(csv.DictReader(open(path)))
    assert sorted((r["gpu"], int(r["d"])) for r in rows) == [
        ("A100-SXM4-80GB", 64), ("A100-SXM4-80GB", 256), ("T4", 64)]
    assert crossing.pair_refusal("T4", "fp16", 64, N=256) is None
    assert "sm_80" in crossing.pair_refusal("T4", "bf16", 64, N=256)
