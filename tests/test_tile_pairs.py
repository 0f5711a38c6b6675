"""The tile-pair counts of the fused kernels' traffic models in closed form: equal to an
enumeration of the pairs (the kernels' own loops, written out) on many random shapes, causal
and not, Nq != Nk; at N = 2^20 in well under a second and a few kilobytes, where the
enumeration would build ~10^9 tuples; visible_pairs against a brute-force mask."""

import time
import tracemalloc

import numpy as np
import pytest

from ckptlab import reference as ref
from ckptlab.measure import pair_counts, traffic, traffic_tc


def enumerate_pairs(Nq, Nk, Br, Bc, causal) -> list:
    """(rows, cols) of every (Q tile, K/V tile) pair, as the kernels loop: every K/V tile, or
    (causal) those starting at or before the last key the Q tile's last row sees."""
    pairs = []
    for q0 in range(0, Nq, Br):
        last_key = min(q0 + Br, Nq) - 1 + Nk - Nq
        for k0 in range(0, Nk, Bc):
            if causal and k0 > last_key:
                break
            pairs.append((min(Br, Nq - q0), min(Bc, Nk - k0)))
    return pairs


def test_closed_form_equals_the_enumeration_on_random_shapes():
    g = np.random.default_rng()
    tiles = (1, 2, 3, 5, 7, 8, 12, 16, 32, 64)
    for _ in range(1000):
        Nq, Nk = (int(x) for x in g.integers(1, 160, 2))
        Br, Bc = (int(x) for x in g.choice(tiles, 2))
        for causal in (False, True):
            pairs = enumerate_pairs(Nq, Nk, Br, Bc, causal)
            want = (len(pairs), sum(r for r, _ in pairs), sum(c for _, c in pairs))
            got = pair_counts.tile_pairs(Nq, Nk, Br, Bc, causal)
            assert (got.count, got.rows, got.cols) == want, (Nq, Nk, Br, Bc, causal)


@pytest.mark.parametrize("Nq,Nk", [(1, 1), (17, 40), (40, 17), (64, 64), (100, 3), (129, 128)])
def test_visited_tiles_cover_every_visible_pair(Nq, Nk):
    """The causal counts against a brute-force mask; the enumerated pairs cover every visible
    (i, j) and their area is what the visited tiles hold."""
    mask = ref.causal_visible(Nq, Nk)
    assert pair_counts.visible_pairs(Nq, Nk, True) == mask.sum()
    assert pair_counts.visible_pairs(Nq, Nk, False) == Nq * Nk
    for Br, Bc in ((16, 8), (32, 32), (8, 64)):
        covered = sum(r * c for r, c in enumerate_pairs(Nq, Nk, Br, Bc, True))
        visited = np.zeros((Nq, Nk), bool)  # the tiles that the pairs stand for
        for q0 in range(0, Nq, Br):
            last = min(q0 + Br, Nq) - 1 + Nk - Nq
            for k0 in range(0, Nk, Bc):
                visited[q0:q0 + Br, k0:k0 + Bc] = k0 <= last
        assert covered == visited.sum() and not (mask & ~visited).any()


def test_visible_pairs_closed_form_on_random_shapes():
    g = np.random.default_rng()
    for _ in range(200):
        Nq, Nk = (int(x) for x in g.integers(1, 300, 2))
        want = sum(max(0, min(Nk, i + Nk - Nq + 1)) for i in range(Nq))
        assert pair_counts.visible_pairs(Nq, Nk, True) == want, (Nq, Nk)


def test_a_million_tokens_in_well_under_a_second_and_bounded_memory():
    """Every model of every method at N = 2^20 (and 2^20 + 1 queries against 2^20 - 3 keys),
    causal and not, d = 64 and 256 (the smallest tiles, most pairs): the enumeration would
    hold up to 8.6e9 pairs (2^20 / 8 squared / 2)."""
    N = 2**20
    tracemalloc.start()
    start = time.perf_counter()
    for Nq, Nk in ((N, N), (N + 1, N - 3)):
        for d in (64, 256):
            for causal in (False, True):
                for variant in traffic.VARIANTS:
                    traffic.launches(variant, 1, 1, Nq, Nk, d, causal)
                for method in traffic_tc.METHODS:
                    traffic_tc.tc_launches(method, 1, 1, Nq, Nk, d, causal)
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert seconds < 1.0 and peak < 1 << 20, (seconds, peak)
    Tr, Tc = N // 8, N // 8  # d = 256 backward tiles: 8 x 8; causal keeps the lower triangle
    assert pair_counts.tile_pairs(N, N, 8, 8, True).count == Tr * (Tc + 1) // 2
    assert pair_counts.tile_pairs(N, N, 8, 8, False).count == Tr * Tc
    assert pair_counts.visible_pairs(N, N, True) == N * (N + 1) // 2
