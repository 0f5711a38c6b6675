"""The exercises' alternative truths (slips.py), each against what it says it is: a 16 x 16
tile read transposed, the scores scaled twice, D fitted from a dS whose P is small everywhere,
a wmma fragment read past its tile, and each flash-backward slip changing only the gradient it
names."""

import numpy as np

from ckptlab.exercises import write
from ckptlab.exercises.write import flash, slips


def test_a_square_tile_read_transposed_is_each_16_by_16_tile_transposed():
    x = np.arange(32.0 * 20).reshape(32, 20)
    t = slips.tile_transposed(x)
    assert np.array_equal(t[:16, :16], x[:16, :16].T)
    assert np.array_equal(t[16:, :16], x[16:, :16].T)
    assert t.shape == x.shape


def test_the_scores_scaled_twice_pass_scale_squared():
    seen = []
    _, alt = slips.scale_squared(lambda case, inputs, scale: seen.append(scale))
    case = write.get("flash_forward").cases[0]
    alt(case, None)
    scale = case.options.get("scale") or 1 / np.sqrt(case.sizes["d"])
    assert seen == [scale * scale]


def test_d_is_fitted_where_p_is_small_everywhere():
    """Rows of P all about 0.05 (20 keys): D' = sum_j dP_ij is still found and named."""
    rng = np.random.default_rng(0)
    P = rng.uniform(0.04, 0.06, (3, 20))
    dP = rng.normal(size=(3, 20))
    wrong = dP.sum(-1, keepdims=True)
    alt = slips.ds_fitted_D(lambda case, inputs: (P, dP))
    got = alt(None, None, {"dS": P * (dP - wrong)})
    assert "D = sum_j dP_ij (no P)" in got["_what"], got["_what"]
    assert np.allclose(got["dS"], P * (dP - wrong))


def test_a_fragment_read_past_its_tile_is_a_fault_not_a_truth():
    arrays = {"A": np.ones((16, 16)), "B": np.ones((16, 16))}
    assert slips.wmma_wrong_ld("a", 17)(None, arrays) is None
    assert slips.wmma_wrong_ld("b", 8)(None, arrays) is not None


def test_each_backward_slip_changes_only_what_it_names():
    ex = write.get("flash_backward")
    case = ex.cases[0]
    inputs = ex.inputs(case)
    truth = flash.slipped(case, inputs)
    bs = slips.backward_slips(flash.options, flash._mask)
    in_dv = bs["swap_p_dv"][1](case, inputs)
    assert np.allclose(in_dv["dK"], truth["dK"]) and np.allclose(in_dv["dQ"], truth["dQ"])
    assert not np.allclose(in_dv["dV"], truth["dV"])
    in_dk = bs["swap_ds_dk"][1](case, inputs)
    assert np.allclose(in_dk["dV"], truth["dV"]) and not np.allclose(in_dk["dK"], truth["dK"])
