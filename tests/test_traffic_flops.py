"""Hardware FLOPs as run: the traffic model's closed forms against loops that mirror each kernel's
own loops, thread by thread (the dumbest reference: which tiles a block visits, as the .cu files
decide it, and how many multiply-adds each thread's loops run). Padded tail tiles, the head dim
padded to the tile head dim, causal skipping and the atomic dQ's early stop are all counted
as the kernels run them; 2 FLOPs per multiply-add (the convention in traffic's docstring)."""

import pytest

from ckptlab.kernels.table import LANES, NAIVE_TILE, bwd_tiles, fwd_tiles, tile_head_dim
from ckptlab.measure import traffic


def cdiv(a, b):
    return -(-a // b)


def fwd_tiles_of_block(q0, Nq, Nk, Br, Bc, causal):
    """n_tiles of attn_flash_fwd and attn_flash_bwd_dq, as the kernels compute it."""
    Tc = cdiv(Nk, Bc)
    if not causal:
        return Tc
    last_key = min(q0 + Br, Nq) - 1 + Nk - Nq
    return 0 if last_key < 0 else min(Tc, last_key // Bc + 1)


def mirror_forward(Nq, Nk, Dt, Br, Bc, causal):
    macs = 0
    for q0 in range(0, Nq, Br):  # one block
        for _ in range(fwd_tiles_of_block(q0, Nq, Nk, Br, Bc, causal)):
            for _r in range(Br):
                for _lane in range(LANES):
                    macs += (Bc // LANES) * Dt  # s[c] = q_i . k_j
                    macs += (Dt // LANES) * Bc  # acc[c] += P V
    return macs


def mirror_dkdv(Nq, Nk, Dt, Br, Bc, causal, atomic, stored):
    macs, Tr = 0, cdiv(Nq, Br)
    for k0 in range(0, Nk, Bc):  # one block
        a0 = 0
        if causal:
            i0 = k0 - (Nk - Nq)
            a0 = Tr if i0 > Nq - 1 else max(i0, 0) // Br
        for a in range(a0, Tr):
            q0 = a * Br
            for _y in range(Bc):
                for _lane in range(LANES):
                    macs += (Br // LANES) * Dt * (1 if stored else 2)  # (S), dO V^T
                    macs += (Dt // LANES) * Br * 2  # dV, dK
                if atomic:
                    for ii in range(_y, Br, Bc):
                        if q0 + ii >= Nq:
                            break
                        macs += LANES * (Dt // LANES) * Bc  # dQ += dS K
    return macs


def mirror_dq(Nq, Nk, Dt, Br, Bc, causal, stored):
    macs = 0
    for q0 in range(0, Nq, Br):
        for _ in range(fwd_tiles_of_block(q0, Nq, Nk, Br, Bc, causal)):
            for _r in range(Br):
                for _lane in range(LANES):
                    macs += (Bc // LANES) * Dt * (1 if stored else 2)  # (S), dO V^T
                    macs += (Dt // LANES) * Bc  # dQ += dS K
    return macs


def mirror_naive_matmul(M, N, K):
    """naive_matmul_tile: every thread of every block runs every k0 step, NAIVE_TILE deep."""
    T = NAIVE_TILE
    return cdiv(N, T) * cdiv(M, T) * T * T * cdiv(K, T) * T


SHAPES = [(17, 40, 8, True), (40, 17, 40, True), (64, 64, 64, False), (100, 37, 96, False),
          (33, 70, 200, True), (1, 1, 16, False)]


@pytest.mark.parametrize("Nq,Nk,d,causal", SHAPES)
def test_fused_flops_as_run(Nq, Nk, d, causal):
    Dt = tile_head_dim(d)
    for stored in (False, True):
        fwd = traffic._fused_forward(1, 1, Nq, Nk, d, causal, None, None, stored)
        assert fwd[0].flops == 2 * mirror_forward(Nq, Nk, Dt, *fwd_tiles(d), causal)
        for det in (False, True):
            _, dkdv, *dq = traffic._fused_backward(1, 1, Nq, Nk, d, causal, det, None, None,
                                                   stored)
            Br, Bc = bwd_tiles(d)
            assert dkdv.flops == 2 * mirror_dkdv(Nq, Nk, Dt, Br, Bc, causal, not det, stored)
            if det:
                assert dq[0].flops == 2 * mirror_dq(Nq, Nk, Dt, Br, Bc, causal, stored)


@pytest.mark.parametrize("Nq,Nk,d,causal", SHAPES)
def test_naive_flops_as_run(Nq, Nk, d, causal):
    fwd = traffic.naive_forward_traffic(1, 1, Nq, Nk, d, causal)
    assert [x.flops for x in fwd] == [2 * mirror_naive_matmul(Nq, Nk, d), 0,
                                      2 * mirror_naive_matmul(Nq, d, Nk)]
    bwd = traffic.naive_backward_traffic(1, 1, Nq, Nk, d, causal)
    assert [x.flops for x in bwd] == [2 * mirror_naive_matmul(Nk, d, Nq),
                                      2 * mirror_naive_matmul(Nq, Nk, d), 0,
                                      2 * mirror_naive_matmul(Nq, d, Nk),
                                      2 * mirror_naive_matmul(Nk, d, Nq)]


def test_padding_is_the_difference_to_the_useful_work():
    """Where nothing is padded (tiles divide N, d a tile head dim, not causal) the hardware
    FLOPs are model FLOPs plus recompute exactly; with padding they exceed it."""
    B, H = 2, 1
    for method in traffic.METHODS:
        exact = traffic.totals(traffic.launches(method, B, H, 128, 128, 64))
        useful = traffic.model_flops(B, H, 128, 128, 64) * 3  # forward + backward (2x)
        assert exact["flops"] == useful + exact["recompute_flops"], method
        padded = traffic.totals(traffic.launches(method, B, H, 100, 100, 40))
        useful = traffic.model_flops(B, H, 100, 100, 40) * 3
        assert padded["flops"] > useful + padded["recompute_flops"], method
