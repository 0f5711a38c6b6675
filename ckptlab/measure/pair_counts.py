"""Which (query, key) pairs an attention sees and which (Q tile, K/V tile) pairs a fused
kernel visits, counted in closed form: how often the traffic models (traffic.py, traffic_tc.py)
charge a tile's loads and how many whole-tile products they charge FLOPs for.

    visible_pairs   the (i, j) with query i seeing key j: Nq Nk, or (causal, keys aligned to the
                    end, j <= i + Nk - Nq) an arithmetic series
    tile_pairs      the visited tile pairs, with the Q rows and the K/V rows they load: all
                    Tr Tc, or (causal) a floor sum, O(log N) at any N (floor_sum)
    first_seen_row  where the first Q tile that sees any key starts

tests/test_tile_pairs.py holds them against an enumeration of the kernels' own loops.
"""

from __future__ import annotations

from dataclasses import dataclass


def visible_pairs(Nq: int, Nk: int, causal: bool) -> int:
    """Number of (i, j) with query i seeing key j: Nq*Nk, or (causal) j <= i + Nk - Nq: rows
    max(0, Nq - Nk) .. Nq - 1 see one key more each, up to Nk: an arithmetic series."""
    if not causal:
        return Nq * Nk
    first = max(0, Nq - Nk)  # the first query row that sees a key: first + Nk - Nq + 1 of them
    n = Nq - first  # rows that see keys; the last sees Nk
    return (first + Nk - Nq + 1 + Nk) * n // 2


@dataclass(frozen=True)
class TilePairs:
    """The (Q tile, K/V tile) pairs a fused kernel visits, summed: how many, the Q rows they
    load (min(Br, Nq - q0) each: Q, dO, L, D in dK/dV) and the K/V rows (min(Bc, Nk - k0) each:
    K, V in the forward and the dQ kernel)."""

    count: int
    rows: int
    cols: int


def floor_sum(n: int, m: int, a: int, b: int) -> int:
    """sum(floor((a*i + b) / m) for i in range(n)), a, b >= 0, m >= 1, in O(log m) steps: take
    out the whole parts of a/m and b/m, then swap the axes of the lattice points under the line
    y = (a*x + b)/m (the recursion of the AtCoder Library's floor_sum, atcoder/math.hpp)."""
    total = 0
    while n > 0:
        total += (a // m) * n * (n - 1) // 2 + (b // m) * n
        a, b = a % m, b % m
        y_max = a * n + b  # the line at x = n, below m: no lattice points left
        if y_max < m:
            break
        n, b, m, a = y_max // m, y_max % m, a, m
    return total


def tile_pairs(Nq: int, Nk: int, Br: int, Bc: int, causal: bool) -> TilePairs:
    """The (Q tile, K/V tile) pairs a fused kernel visits: all Tr * Tc, or (causal) those whose
    key tile starts at or before the last key the Q tile's last row sees. Closed form, O(log N):
    full Q tile t visits n_t = clamp(floor((t*Br + c) / Bc) + 1, 0, Tc) key tiles, c = Br - 1 +
    Nk - Nq, nondecreasing in t: none before tile lo, all from tile hi on, a floor sum between
    (each visited key tile a full Bc there); the tail Q tile sees key Nk - 1, so all Tc."""
    Tr, Tc = -(-Nq // Br), -(-Nk // Bc)
    if not causal:
        return TilePairs(Tr * Tc, Nq * Tc, Tr * Nk)
    full, tail = Nq // Br, Nq % Br  # full Q tiles, rows of the tail Q tile
    c = Br - 1 + Nk - Nq
    lo = min(full, max(0, -(c // Br)))  # tiles t < lo: t*Br + c < 0, no key
    hi = min(full, max(lo, -(-((Tc - 1) * Bc - c) // Br)))  # t >= hi: t*Br + c >= (Tc-1)*Bc
    partial = floor_sum(hi - lo, Bc, Br, lo * Br + c) + (hi - lo)  # sum of n_t, lo <= t < hi
    count = partial + (full - hi) * Tc + (Tc if tail else 0)
    rows = Br * (partial + (full - hi) * Tc) + tail * Tc
    cols = Bc * partial + Nk * (full - hi + (1 if tail else 0))
    return TilePairs(count, rows, cols)


def first_seen_row(Nq: int, Nk: int, Br: int, causal: bool) -> int:
    """First query row of the first Q tile that sees any key: 0, or (causal, Nq > Nk) the
    start of the tile holding row Nq - Nk, the first row that sees key 0. The Q tiles before it
    are in no visited pair, so no backward kernel that loops over Q tiles reads them."""
    return (max(0, Nq - Nk) // Br) * Br if causal else 0
