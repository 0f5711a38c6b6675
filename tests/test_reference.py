"""The float64 reference (ckptlab.reference) against independent oracles: PyTorch's float64
autograd (and its scaled_dot_product_attention), central finite differences, and the tiled
flash version against the textbook one. All on the CPU, no kernels involved."""

import numpy as np
import pytest

from ckptlab import reference as ref
from ckptlab import rng

# float64 end to end: reference vs PyTorch differ only by summation order, ~1e-15 relative
TOL64 = 1e-12


def rel(x, y):
    """Relative Frobenius error ||x - y|| / ||y||."""
    return np.linalg.norm(x - y) / np.linalg.norm(y)


def inputs(B, H, Nq, Nk, d, seed=0):
    g = np.random.default_rng(seed)
    q, k, v = (g.standard_normal(s) for s in ((B, H, Nq, d), (B, H, Nk, d), (B, H, Nk, d)))
    dO = g.standard_normal((B, H, Nq, d))
    return q, k, v, dO


def torch_attention(q, k, v, dO, causal, scale, p, seed, offset):
    """O, L and (dQ, dK, dV) from PyTorch autograd on a hand-written masked softmax (the mask
    and dropout factor built independently of ckptlab.reference; the row max is detached,
    which leaves softmax's value and gradient unchanged and keeps empty rows NaN-free)."""
    import torch  # callers take the `torch` fixture, skipped where PyTorch is missing

    q, k, v = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    Nq, Nk = q.shape[2], k.shape[2]
    S = scale * q @ k.transpose(-1, -2)
    if causal:
        i = torch.arange(Nq)[:, None]
        j = torch.arange(Nk)[None, :]
        S = S.masked_fill(j > i + Nk - Nq, float("-inf"))
    m = S.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    E = torch.exp(S - m)
    l = E.sum(-1, keepdim=True)
    P = E / torch.where(l > 0, l, torch.ones_like(l))
    keep = torch.tensor(rng.keep_mask(seed, offset, tuple(P.shape), p))
    O = (P * keep / (1 - p)) @ v
    L = torch.where(l > 0, m + torch.log(l), torch.full_like(l, float("inf")))[..., 0]
    O.backward(torch.tensor(dO))
    return O.detach().numpy(), L.detach().numpy(), (q.grad.numpy(), k.grad.numpy(),
                                                      v.grad.numpy())


CASES = [  # (B, H, Nq, Nk, d, causal, dropout_p)
    (1, 2, 17, 17, 16, False, 0.0),
    (2, 1, 17, 40, 8, True, 0.0),  # Nk > Nq: every row sees at least Nk - Nq + 1 keys
    (1, 2, 40, 17, 8, True, 0.0),  # Nq > Nk: rows 0..22 see no key at all
    (1, 1, 1, 33, 16, True, 0.0),
    (1, 2, 33, 25, 16, False, 0.3),
    (1, 1, 30, 30, 8, True, 0.5),
]


@pytest.mark.parametrize("B,H,Nq,Nk,d,causal,p", CASES)
def test_reference_matches_torch_autograd(B, H, Nq, Nk, d, causal, p, torch):
    q, k, v, dO = inputs(B, H, Nq, Nk, d)
    scale = 0.7
    O, L = ref.forward(q, k, v, causal, scale, p, seed=5, offset=2)
    grads = ref.backward(dO, q, k, v, causal, scale, p, seed=5, offset=2)
    O_t, L_t, grads_t = torch_attention(q, k, v, dO, causal, scale, p, 5, 2)
    assert rel(O, O_t) < TOL64
    assert np.array_equal(np.isinf(L), np.isinf(L_t))
    assert np.allclose(L[np.isfinite(L)], L_t[np.isfinite(L_t)], rtol=TOL64, atol=0)
    for name, g, g_t in zip(("dQ", "dK", "dV"), grads, grads_t, strict=True):
        assert np.all(np.isfinite(g)), name
        assert rel(g, g_t) < TOL64, name


@pytest.mark.parametrize("causal", [False, True])
def test_reference_matches_torch_sdpa(causal, torch):
    """PyTorch's own attention (no dropout; Nk > Nq so that no causal row is empty)."""
    q, k, v, dO = inputs(2, 2, 9, 14, 16, seed=1)
    mask = ref.causal_visible(9, 14) if causal else None
    qt, kt, vt = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    O_t = torch.nn.functional.scaled_dot_product_attention(
        qt, kt, vt, attn_mask=None if mask is None else torch.tensor(mask), scale=0.3)
    O_t.backward(torch.tensor(dO))
    O, _ = ref.forward(q, k, v, causal, 0.3)
    dQ, dK, dV = ref.backward(dO, q, k, v, causal, 0.3)
    assert rel(O, O_t.detach().numpy()) < TOL64
    for g, t in ((dQ, qt), (dK, kt), (dV, vt)):
        assert rel(g, t.grad.numpy()) < TOL64


@pytest.mark.parametrize("causal,p", [(False, 0.0), (True, 0.0), (True, 0.4)])
def test_reference_backward_matches_finite_differences(causal, p):
    """Central differences of f = sum(O * dO) on every input element of a tiny problem. The
    error of a central difference is O(eps^2 f''') + O(u f / eps): ~1e-9 at eps = 1e-5."""
    q, k, v, dO = inputs(1, 1, 5, 4, 3, seed=2)
    grads = ref.backward(dO, q, k, v, causal, 0.9, p, seed=3, offset=1)

    def f(q, k, v):
        return np.sum(ref.forward(q, k, v, causal, 0.9, p, seed=3, offset=1)[0] * dO)

    eps = 1e-5
    for which, g in enumerate(grads):
        args = [q, k, v]
        fd = np.zeros_like(args[which])
        for idx in np.ndindex(fd.shape):
            plus, minus = [a.copy() for a in args], [a.copy() for a in args]
            plus[which][idx] += eps
            minus[which][idx] -= eps
            fd[idx] = (f(*plus) - f(*minus)) / (2 * eps)
        name = ("dQ", "dK", "dV")[which]
        assert np.max(np.abs(fd - g)) < 1e-8 * max(1.0, np.max(np.abs(g))), name


@pytest.mark.parametrize("causal,p", [(False, 0.0), (True, 0.0), (True, 0.25), (False, 0.25)])
@pytest.mark.parametrize("Nq,Nk", [(37, 37), (21, 50), (50, 21), (1, 9)])
def test_tiled_flash_equals_textbook(causal, p, Nq, Nk):
    """Online softmax and recompute-P tile by tile give the same numbers as the N x N
    formulas (float64: only rounding differs). Odd tile sizes exercise the tails."""
    q, k, v, dO = inputs(1, 2, Nq, Nk, 8, seed=4)
    O, L = ref.forward(q, k, v, causal, None, p, seed=9, offset=4)
    O_t, L_t = ref.tiled_forward(q, k, v, causal, None, p, seed=9, offset=4, Br=16, Bc=8)
    assert np.max(np.abs(O_t - O)) < 1e-12
    assert np.array_equal(L, L_t) or np.allclose(L, L_t, rtol=1e-13, atol=0)
    grads = ref.backward(dO, q, k, v, causal, None, p, seed=9, offset=4)
    grads_t = ref.tiled_backward(dO, q, k, v, O_t, L_t, causal, None, p, seed=9, offset=4,
                                 Br=8, Bc=16)
    for g, g_t in zip(grads, grads_t, strict=True):
        assert np.max(np.abs(g_t - g)) < 1e-12


def test_rows_that_see_no_key():
    """Causal with Nq > Nk: the first Nq - Nk rows see nothing: O = 0, L = +inf, dQ = 0, and
    the other rows are the attention of the last Nk queries alone."""
    q, k, v, dO = inputs(1, 1, 12, 5, 4, seed=6)
    O, L = ref.forward(q, k, v, causal=True)
    dQ, dK, dV = ref.backward(dO, q, k, v, causal=True)
    assert np.all(O[:, :, :7] == 0) and np.all(np.isposinf(L[:, :, :7]))
    assert np.all(dQ[:, :, :7] == 0)
    O2, L2 = ref.forward(q[:, :, 7:], k, v, causal=True)
    dQ2, dK2, dV2 = ref.backward(dO[:, :, 7:], q[:, :, 7:], k, v, causal=True)
    assert np.allclose(O[:, :, 7:], O2, rtol=1e-14, atol=0)
    assert np.allclose(L[:, :, 7:], L2, rtol=1e-14, atol=0)
    for a, b in ((dQ[:, :, 7:], dQ2), (dK, dK2), (dV, dV2)):
        assert np.allclose(a, b, rtol=1e-13, atol=1e-15)


def test_large_scores_do_not_overflow():
    """|S| ~ 1e4: exp(S) alone would be inf; the max-subtracted softmax stays finite."""
    q, k, v, dO = inputs(1, 1, 8, 8, 4, seed=7)
    O, L = ref.forward(q * 100, k * 100, v, scale=1.0)
    assert np.max(np.abs(L)) > 1e3 and np.all(np.isfinite(O)) and np.all(np.isfinite(L))
    assert all(np.all(np.isfinite(g)) for g in ref.backward(dO, q * 100, k * 100, v, scale=1.0))


def test_dropout_factor_is_the_rng_mask():
    shape = (2, 3, 5, 7)
    Z = ref.dropout_factor(shape, 0.25, seed=11, offset=3)
    keep = rng.keep_mask(11, 3, shape, 0.25)
    assert np.array_equal(Z > 0, keep) and np.allclose(Z[keep], 1 / 0.75)
    tile = ref._tile_dropout(2, 3, 5, 7, 1, 4, 2, 6, 0.25, 11, 3, np.float64)
    assert np.array_equal(tile, Z[:, :, 1:4, 2:6])


def test_float32_mode_is_float32_and_close():
    """dtype=float32 computes in float32: close to float64 (~1e-7 relative), not equal."""
    q, k, v, dO = inputs(1, 1, 20, 30, 16, seed=8)
    O64, _ = ref.forward(q, k, v)
    O32, L32 = ref.forward(q, k, v, dtype=np.float32)
    assert O32.dtype == np.float32 and L32.dtype == np.float32
    assert 0 < rel(O32, O64) < 1e-5
    g32 = ref.backward(dO, q, k, v, dtype=np.float32)
    assert all(g.dtype == np.float32 for g in g32)
