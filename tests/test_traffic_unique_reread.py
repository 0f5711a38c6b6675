"""Unique bytes where a tile is loaded more than once: shapes with two or more Q tiles that each
see keys (so the forward and the deterministic dQ kernel load every K and V tile more than once)
and two or more K/V tiles that each see queries (so the dK/dV kernel loads Q, dO, L and D more
than once). Counted bytes then exceed unique ones, and the emulator's unique counts must still
equal the model's exactly, per kernel and argument."""

import pytest
from traffic_check import counted, counted_unique, inputs, modeled, modeled_unique

from ckptlab import emu, kernels
from ckptlab.kernels.table import bwd_tiles, fwd_tiles
from ckptlab.measure import pair_counts, traffic

pytestmark = pytest.mark.counted

SHAPES = [  # (B, H, Nq, Nk, d, causal): Nq > the forward's Br = 64 at d = 16 and 32
    (1, 1, 130, 70, 16, False),
    (1, 1, 130, 70, 16, True),  # Q tile 0 (rows 0..63) sees keys 0..3: causal keeps it
    (1, 2, 97, 45, 32, True),
]


@pytest.mark.parametrize("B,H,Nq,Nk,d,causal", SHAPES)
def test_the_shapes_re_read_tiles(B, H, Nq, Nk, d, causal):
    """What makes these shapes worth running: every argument loaded more than once."""
    fwd = pair_counts.tile_pairs(Nq, Nk, *fwd_tiles(d), causal)
    bwd = pair_counts.tile_pairs(Nq, Nk, *bwd_tiles(d), causal)
    assert fwd.cols > Nk and bwd.cols > Nk and bwd.rows > Nq


@pytest.mark.parametrize("B,H,Nq,Nk,d,causal", SHAPES)
@pytest.mark.parametrize("variant", traffic.VARIANTS)
def test_unique_bytes_equal_the_model_when_tiles_are_re_read(variant, B, H, Nq, Nk, d, causal):
    method, det = variant.removesuffix("-det"), variant.endswith("-det")
    q, k, v, dO = inputs(B, H, Nq, Nk, d)
    with emu.record() as rec:
        _, saved = kernels.forward(method, q, k, v, causal=causal)
        kernels.backward(method, dO, q, k, v, saved, det)
    model = traffic.launches(variant, B, H, Nq, Nk, d, causal)
    assert counted(rec) == modeled(model)
    assert counted_unique(rec) == modeled_unique(model)
    assert rec.global_unique_bytes == traffic.totals(model)["unique_bytes"]
