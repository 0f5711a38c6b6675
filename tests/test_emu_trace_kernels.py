"""The access trace of the lab's kernels against their tiling formulas: the tiled SGEMM's
block (bx, by) reads rows by*TILE.. of A and columns bx*TILE.. of B and writes its C tile; the
flash forward's block (x, bh) reads the Q rows of its tile and every K, V row it may see."""

import numpy as np
import pytest

from ckptlab import device, emu, kernels
from ckptlab.kernels.common import ceil_div
from ckptlab.kernels.table import LANES, SGEMM_TILE

pytestmark = pytest.mark.counted  # byte counts, bounds and race checks

T = SGEMM_TILE
M, N, K = 40, 24, 56  # lab 01's exercise size: tails in every dimension


def sgemm_trace(race_check: bool):
    rng = np.random.default_rng(0)
    A = rng.standard_normal((M, K), dtype=np.float32)
    B = rng.standard_normal((K, N), dtype=np.float32)
    C = np.full((M, N), np.nan, np.float32)
    f = device.load("sgemm_tiled.cu").get_function("sgemm_tiled")
    args = (A, B, C, np.int32(M), np.int32(N), np.int32(K))
    grid = (ceil_div(N, T), ceil_div(M, T))
    with emu.settings(race_check=race_check):
        plain = f(grid, (T, T), args)
        with emu.trace() as tr:
            traced = f(grid, (T, T), args)
    assert plain.args == traced.args  # the same counts, traced or not
    np.testing.assert_allclose(C, A.astype(np.float64) @ B, rtol=1e-5, atol=1e-5)
    return tr.last


@pytest.mark.parametrize("race_check", [False, True])
def test_sgemm_blocks_read_their_rows_of_A_and_columns_of_B(race_check):
    t = sgemm_trace(race_check)
    assert t.grid == (2, 3, 1) and t.block_dim == (T, T, 1)
    assert t.total_events == M * K * 2 + K * N * 3 + M * N  # ceil(N/T) = 2, ceil(M/T) = 3
    for bx in range(2):
        for by in range(3):
            rows, cols = np.arange(M) // T == by, np.arange(N) // T == bx
            assert np.array_equal(t["A"].mask("read", block=(bx, by)),
                                  np.repeat(rows[:, None], K, axis=1))
            assert np.array_equal(t["B"].mask("read", block=(bx, by)),
                                  np.repeat(cols[None, :], K, axis=0))
            assert np.array_equal(t["C"].mask("write", block=(bx, by)), np.outer(rows, cols))
    # every element of A is read by the 2 blocks of its row of C, once each; of B by 3
    assert (t["A"].count("read", by="block") == 2).all()
    assert (t["A"].count("read", by="access") == 2).all()
    assert (t["B"].count("read", by="block") == 3).all()
    assert (t["C"].count("write", by="thread") == 1).all()
    assert not t["A"].mask("write").any() and t["C"].never_written() == []
    rows, cols = np.meshgrid(np.arange(M), np.arange(N), indexing="ij")
    assert np.array_equal(t["C"].block_map(), rows // T * 2 + cols // T)


def test_sgemm_threads_stage_one_element_of_each_k_tile():
    t = sgemm_trace(False)
    # thread (tx, ty) stages As[ty][tx] = A[row, k0 + tx] and Bs[ty][tx] = B[k0 + ty, col]
    bx, by, tx, ty = 1, 2, 3, 7
    row, col = by * T + ty, bx * T + tx
    assert t["A"].elements("read", block=(bx, by), thread=(tx, ty)) == [
        (row, k0 + tx) for k0 in range(0, K, T) if k0 + tx < K]
    assert t["B"].elements("read", block=(bx, by), thread=(tx, ty)) == [
        (k0 + ty, col) for k0 in range(0, K, T) if k0 + ty < K]
    assert t["C"].elements("write", block=(bx, by), thread=(tx, ty)) == [(row, col)]
    # A[r, k] is read by thread (k % T, r % T) of both blocks of row r // T
    r, k = 37, 50
    assert t["A"].readers((r, k)) == [((b, r // T, 0), (k % T, r % T, 0)) for b in range(2)]
    assert t["B"].readers((k, 20), by="block") == [(1, b, 0) for b in range(3)]
    # thread (tx, ty) = (12, 15) of block (1, 2): row 47 >= M and col 28 >= N, so it stages
    # zeros for A and for B without reading either, and writes nothing
    for name, kind in (("A", "read"), ("B", "read"), ("C", "write")):
        assert t[name].elements(kind, block=(1, 2), thread=(12, 15)) == []


@pytest.mark.parametrize("causal, Nq, Nk", [(False, 40, 40), (True, 40, 40), (True, 24, 40)])
def test_flash_forward_block_reads_its_q_tile_and_the_k_v_rows_it_may_see(causal, Nq, Nk):
    B, H, d, Br, Bc = 1, 2, 16, 16, 16
    rng = np.random.default_rng(1)
    q = rng.standard_normal((B, H, Nq, d)).astype(np.float32)
    k, v = (rng.standard_normal((B, H, Nk, d)).astype(np.float32) for _ in range(2))
    with emu.trace() as tr:
        O, saved = kernels.flash_forward(q, k, v, causal=causal, tiles=(Br, Bc))
    assert np.isfinite(O).all()
    t = tr.last
    assert t.grid == (ceil_div(Nq, Br), B * H, 1) and t.block_dim == (LANES, Br, 1)
    if not causal:  # the kernel header's traffic in accesses: Q, O, L once, K and V Tr times
        assert t.total_events == B * H * (2 * Nq * d + Nq + 2 * ceil_div(Nq, Br) * Nk * d)
    for x in range(ceil_div(Nq, Br)):
        q0 = x * Br
        seen = Nk  # keys its tiles cover: all, or (causal) up to its last row's last key
        if causal:
            last_key = min(q0 + Br, Nq) - 1 + Nk - Nq
            seen = 0 if last_key < 0 else min(Nk, (last_key // Bc + 1) * Bc)
        for bh in range(B * H):
            want_q = np.zeros((B, H, Nq, d), bool)
            want_q[0, bh, q0:q0 + Br] = True
            want_kv = np.zeros((B, H, Nk, d), bool)
            want_kv[0, bh, :seen] = True
            assert np.array_equal(t["Q"].mask("read", block=(x, bh)), want_q)
            for name in ("K", "V"):
                assert np.array_equal(t[name].mask("read", block=(x, bh)), want_kv)
            assert np.array_equal(t["O"].mask("write", block=(x, bh)), want_q)
            assert t["L"].elements("write", block=(x, bh)) == [
                (0, bh, i) for i in range(q0, min(q0 + Br, Nq))]
    # O[b, h, i, c] is written by row group i % Br (threadIdx.y), lane c % LANES; L by lane 0
    i, c = 21, 13
    assert t["O"].writers((0, 1, i, c)) == [((i // Br, 1, 0), (c % LANES, i % Br, 0))]
    assert t["L"].writers((0, 1, i)) == [((i // Br, 1, 0), (0, i % Br, 0))]
    for name in ("O", "L"):
        assert t[name].never_written() == []
        assert (t[name].count("write", by="access") == 1).all()
    assert not t["Q"].mask("write").any() and t["S"].shape == (0,)
