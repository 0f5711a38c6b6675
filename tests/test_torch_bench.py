"""`python -m ckptlab bench torch`: its rows and table (nothing here asserts a time). The saved
peaks of the naive and flash models differ by exactly what the kernels save differently: per
layer, P (B, H, N, N) against O (B, H, N, d) and L (B, H, N), in fp32."""

from torch_oracle import torch  # noqa: F401  (skips this module without PyTorch)

from ckptlab.cli import bench_torch, main


def test_rows_and_the_saved_bytes_the_kernels_explain():
    L, C, H, N, B = 2, 32, 2, 40, 2
    rows = bench_torch.run(("flash", "naive", "math"), layers=L, width=C, heads=H, seq=N,
                           batch=B, repeats=1)
    by = {r["attention"]: r for r in rows}
    assert set(by) == {"flash", "naive", "math"} and by["math"]["over_math"] == 1.0
    assert all(r["step_s"] > 0 and r["p10_s"] <= r["step_s"] <= r["p90_s"] for r in rows)
    d = C // H
    P, OL = B * H * N * N * 4, B * H * N * (d + 1) * 4
    assert by["naive"]["saved_peak_bytes"] - by["flash"]["saved_peak_bytes"] == L * (P - OL)
    assert "median" in bench_torch.table(rows)


def test_main_refuses_bad_arguments(capsys):
    assert main.main(["bench", "torch", "--attn", "bogus"]) == 2
    assert main.main(["bench", "torch", "--layers", "0"]) == 2
    assert "expected names" in capsys.readouterr().err
