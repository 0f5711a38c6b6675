"""When recompute stops paying: the rule of thumb by hand, the modeled gains against it, the
three methods' decomposition, and `bench crossing` as a user runs it."""

import pytest

from ckptlab.cli import main as cli
from ckptlab.measure import roofline, timemodel, traffic

SIZE = dict(N=4096, B=1, H=16)


def test_rule_of_thumb_by_hand():
    # d < s R / f, s = 8 bytes of fp32 S per pair (written once, read once by dK/dV: in bf16 too,
    # the tensor-core stored kernel keeps S in fp32), f = 14 flash FLOPs per pair per d:
    # A100 fp32, R = 19.5e12 / 2.039e12 = 9.5635 -> 5.465; H200 bf16, R = 989.5e12 / 4.8e12 =
    # 206.15 -> 117.8. Deterministic dQ: S read again (12 bytes), 18 d FLOPs: 2 R / 3.
    assert timemodel.rule_of_thumb("a100", "fp32") == pytest.approx(4 * 9.56351 / 7, rel=1e-5)
    assert timemodel.rule_of_thumb("h200", "bf16") == pytest.approx(4 * 206.146 / 7, rel=1e-5)
    assert timemodel.rule_of_thumb("h200", "bf16", deterministic=True) == pytest.approx(
        2 * 206.146 / 3, rel=1e-5)
    for dtype in ("fp32", "bf16"):
        assert timemodel.per_pair(dtype) == dict(s_bytes=8, stored_flops_per_d=12,
                                                 flash_flops_per_d=14)


def test_crossings_pick_the_first_d_below_one():
    rows = [dict(gpu="g", dtype="fp32", d=d, gain_unique=u, gain_counted=c)
            for d, u, c in [(16, 1.5, 2.0), (64, 0.9, 1.1), (32, 1.2, 0.95), (128, 0.8, 1.2)]]
    assert timemodel.crossings(rows) == {("g", "fp32"): 64}
    assert timemodel.crossings(rows, "gain_counted") == {("g", "fp32"): 32}
    never = [dict(r, gain_unique=2.0) for r in rows]
    assert timemodel.crossings(never) == {("g", "fp32"): None}


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
    """Past the rule's d (5.5 on an A100 in fp32) both methods are compute-bound at large N and
    the gain tends to 12 d / 14 d = 0.857 at the unique-bytes bound."""
    rows = timemodel.recompute_gains(["a100"], ["fp32"], [64], **SIZE)
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
