"""The engine's attention op with impl="stored": float64 gradients against central differences and
against naive and flash, what its closure keeps (S, O, L), its FLOP counts under the one
convention of ckptlab.measure.traffic, and the kernels backend against the NumPy one."""

import numpy as np
import pytest

from ckptlab import device, engine
from ckptlab.engine import Tensor, gradcheck, layers
from ckptlab.measure import traffic
from ckptlab.recompute import ledger

R = np.random.default_rng(7)


def leaf(*shape):
    return Tensor(R.standard_normal(shape), requires_grad=True)


@pytest.mark.parametrize("causal,Nq,Nk", [(False, 5, 5), (True, 3, 6), (True, 6, 3)])
def test_gradcheck_stored(causal, Nq, Nk):
    q, k, v = leaf(2, 2, Nq, 3), leaf(2, 2, Nk, 3), leaf(2, 2, Nk, 3)
    assert gradcheck(lambda q, k, v: layers.attention(q, k, v, causal=causal, impl="stored",
                                                      dropout_p=0.25, scale=0.7), [q, k, v])


def test_three_impls_agree_in_float64():
    """Same O and gradients from the three methods (float64: agreement to rounding), causal
    with rows that see no key (Nq > Nk) and dropout."""
    q, k, v = leaf(1, 2, 7, 4), leaf(1, 2, 4, 4), leaf(1, 2, 4, 4)
    dO = R.standard_normal((1, 2, 7, 4))
    out = {}
    for impl in ("naive", "stored", "flash"):
        for t in (q, k, v):
            t.grad = None
        engine.manual_seed(5)
        O = layers.attention(q, k, v, causal=True, impl=impl, dropout_p=0.3)
        O.backward(dO)
        out[impl] = [O.data] + [t.grad.copy() for t in (q, k, v)]
    for impl in ("stored", "flash"):
        for a, b in zip(out["naive"], out[impl], strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14)


def test_ledger_stored_keeps_s_o_l_and_recomputes_nothing():
    """Saved bytes: q, k, v plus S (N x N), O and L; matmul FLOPs only (traffic's convention):
    forward 2 matmuls, backward 4, recompute 0 (flash: one, S = Q K^T)."""
    B, H, N, d = 2, 3, 16, 4
    q, k, v = (Tensor(R.standard_normal((B, H, N, d)), requires_grad=True, param=False)
               for _ in range(3))
    mm = 2 * B * H * N * N * d
    qkv = 3 * B * H * N * d * 8
    saved = {"naive": B * H * N * N * 8, "stored": B * H * (N * N + N * d + N) * 8,
             "flash": B * H * (N * d + N) * 8}
    for impl, nbytes in saved.items():
        with ledger.record() as led:
            O = layers.attention(q, k, v, impl=impl)
            assert led.bytes == qkv + nbytes
            O.backward(np.ones_like(O.data))
            assert led.bytes == 0
        assert led.flops["forward"] == 2 * mm and led.flops["backward"] == 4 * mm
        assert led.flops["recompute"] == (mm if impl == "flash" else 0)


@pytest.mark.parametrize("impl", ["naive", "stored", "flash"])
def test_kernels_backend(impl):
    """The emulator's fp32 kernels against the NumPy backend (float64), and FLOPs as traffic
    models the launches (d = 24 runs on 32-wide tiles, N = 17 on padded tiles: hardware FLOPs
    include both)."""
    B, H, N, d = 1, 2, 17, 24
    q, k, v = (Tensor(R.standard_normal((B, H, N, d)), requires_grad=True) for _ in range(3))
    dO = R.standard_normal((B, H, N, d))
    out, flops = {}, {}
    for backend in ("numpy", "kernels"):
        for t in (q, k, v):
            t.grad = None
        engine.manual_seed(3)
        with device.use("emu"), ledger.record() as led:
            O = layers.attention(q, k, v, causal=True, impl=impl, dropout_p=0.1,
                                 backend=backend)
            O.backward(dO)
        out[backend] = [O.data] + [t.grad for t in (q, k, v)]
        flops[backend] = dict(led.flops)
    for a, b in zip(out["numpy"], out["kernels"], strict=True):  # fp32 kernels, fp64 truth
        assert np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(a)
    fwd = traffic.totals(traffic.forward_traffic(impl, B, H, N, N, d, True))
    bwd = traffic.totals(traffic.backward_traffic(impl, B, H, N, N, d, True))
    got = flops["kernels"]
    assert got["forward"] == fwd["flops"]
    assert got["backward"] + got["recompute"] == bwd["flops"]
    assert got["recompute"] == bwd["recompute_flops"]
    assert (got["recompute"] > 0) == (impl == "flash")
    if impl == "naive":  # every pair, on 16-padded tiles: more than NumPy's dense matmuls
        assert got["forward"] == 2 * 2 * B * H * 32 * 32 * 32 > flops["numpy"]["forward"]
