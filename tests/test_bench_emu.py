"""The native anchor of `bench emu`: the tiled loop nest compiled with g++ -O2 computes what the
emulated kernel computes, bit for bit, so the comparison of their times compares the same work."""

import numpy as np
import pytest

from ckptlab import device, emu
from ckptlab.cli import bench_emu
from ckptlab.kernels.table import SGEMM_TILE as TILE


@pytest.mark.parametrize("symbol", ["sgemm_loops", "sgemm_one_thread_at_a_time"])
@pytest.mark.parametrize("M,N,K", [(37, 20, 45), (32, 48, 16)])
def test_native_loop_nest_is_bitwise_the_emulated_kernel(M, N, K, symbol):
    rng = np.random.default_rng()
    A = rng.standard_normal((M, K), dtype=np.float32)
    B = rng.standard_normal((K, N), dtype=np.float32)
    C_emu = np.full((M, N), np.nan, np.float32)
    C_native = np.full((M, N), np.nan, np.float32)
    with device.use("emu"), emu.settings(mode="fast"):
        f = device.load("sgemm_tiled.cu").get_function("sgemm_tiled")
        f((-(-N // TILE), -(-M // TILE)), (TILE, TILE),
          (A, B, C_emu, np.int32(M), np.int32(N), np.int32(K)))
    bench_emu.native_sgemm(symbol)(A, B, C_native)
    assert np.array_equal(C_native.view(np.uint32), C_emu.view(np.uint32))
    truth = A.astype(np.float64) @ B.astype(np.float64)
    assert np.allclose(C_native, truth, rtol=1e-5, atol=1e-4)


def test_bench_rows_carry_the_native_anchor_and_the_flash_pair():
    rows = bench_emu.run(size=32, repeats=1, workers=(1,))
    native = [r for r in rows if r["mode"] == "native g++ -O2"]
    assert len(native) == 1 and native[0]["vs_native"] == 1.0
    serial = [r for r in rows if r["mode"] == "native, 1 thread at a time"]
    assert len(serial) == 1 and serial[0]["vs_native"] == serial[0]["cpu_s"] / native[0]["cpu_s"]
    fast = next(r for r in rows if r["mode"] == "fast")
    assert fast["vs_native"] == fast["cpu_s"] / native[0]["cpu_s"] > 0
    several = bench_emu.run(size=32, repeats=1, workers=(2,))  # no row on one worker
    assert [r["mode"] for r in several[-2:]] == list(bench_emu.NATIVE_VARIANTS)
    assert several[0]["cpu_s"] is None
    assert "vs native" in bench_emu.format_rows(rows)
    flash = bench_emu.run_flash(n=24, d=64, repeats=1)
    assert [r["mode"] for r in flash] == ["fast", "counted"]
    assert all(r["min_s"] <= r["median_s"] <= r["max_s"] and r["cpu_s"] > 0 for r in flash)


def test_the_runtime_comparison_refuses_what_it_cannot_compare():
    """bench/emu_ab.py: an unknown revision or no round is one line and exit 2, before any
    worktree or build."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "bench" / "emu_ab.py"
    for argv, message in ((["no-such-revision"], "is not a revision of"),
                          (["HEAD", "--rounds", "0"], "--rounds: at least 1")):
        p = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 2 and message in p.stderr, p.stderr


def test_the_time_check_scales_the_speeds_the_docs_measured():
    """seconds_at_least by hand, from docs/emulator.md's one-worker rows: per mode the SGEMM
    256^3 (47.6 + 130.0 + 308.8 ms) warm-up and 5 repeats, twice; the flash pair at N = 1024
    (311 + 2297 ms) warm-up and 3 repeats. Each size scales it as the work: N^3, N^2."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "emulator.md").read_text()
    for mode, ms in bench_emu.SGEMM_256_MS.items():
        assert f"| {mode:<12} | 1       | {ms:.1f} " in doc, mode
    for mode, ms in bench_emu.FLASH_1024_MS.items():
        assert f"| {mode:<10} | {ms:<14} |" in doc, mode
    sgemm, flash = 0.0476 + 0.1300 + 0.3088, 0.311 + 2.297
    assert bench_emu.seconds_at_least(256, 5, 1024, 3) == pytest.approx(2 * 6 * sgemm + 4 * flash)
    assert bench_emu.seconds_at_least(512, 5, 0, 3) == pytest.approx(8 * 2 * 6 * sgemm)
    assert bench_emu.seconds_at_least(256, 0, 2048, 0) == pytest.approx(2 * sgemm + 4 * flash)
