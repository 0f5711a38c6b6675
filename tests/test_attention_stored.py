"""The store-P pair (the flash kernels with STORED = true) on the emulator: what it stores, that its
backward takes P from the stored S and never from Q K^T, that it reads no S entry the forward did
not write, its ledger and its errors. Its gradients against float64 on the shared grid:
test_attention.py; its bytes against the model: test_attention_traffic.py."""

import numpy as np
import pytest

from ckptlab import device, emu, kernels, rng
from ckptlab import reference as ref
from ckptlab.measure import pair_counts, traffic

TOL = 1e-5


@pytest.fixture(autouse=True, scope="module")
def on_the_emulator():
    with device.use("emu"):
        yield


def make_inputs(B, H, Nq, Nk, d, seed):
    g = np.random.default_rng(seed)
    return tuple(g.standard_normal(s).astype(np.float32)
                 for s in ((B, H, Nq, d), (B, H, Nk, d), (B, H, Nk, d), (B, H, Nq, d)))


def rel(x, y):
    return float(np.linalg.norm(np.asarray(x, np.float64) - y) / np.linalg.norm(y))


# (B, H, Nq, Nk, d, causal, dropout_p): Nq > Nk causal (rows that see no key), Nq < Nk, tails,
# a head dim padded to its tile (40 -> 64), forward tiles != backward tiles at every d
CASES = [(1, 2, 70, 33, 16, True, 0.2), (2, 1, 17, 100, 40, True, 0.0),
         (1, 1, 45, 45, 32, False, 0.3), (1, 1, 9, 130, 128, True, 0.1)]


@pytest.mark.parametrize("B,H,Nq,Nk,d,causal,p", CASES)
def test_stored_forward_is_flash_plus_the_scores(B, H, Nq, Nk, d, causal, p):
    """O and L bitwise those of flash (the same code, one switch); S holds scale q_i . k_j on
    every visible (i, j) and nothing else (the wrapper's NaN poison stays where it is masked)."""
    q, k, v, _ = make_inputs(B, H, Nq, Nk, d, 1)
    kw = dict(causal=causal, dropout_p=p, seed=4, offset=2)
    O_f, flash = kernels.flash_forward(q, k, v, **kw)
    O_s, stored = kernels.stored_forward(q, k, v, **kw)
    assert np.array_equal(O_s, O_f) and np.array_equal(stored.tensors["L"], flash.tensors["L"])
    S = stored.tensors["S"]
    assert S.shape == (B, H, Nq, Nk) and S.dtype == np.float32
    seen = ref.causal_visible(Nq, Nk) if causal else np.ones((Nq, Nk), bool)
    seen = np.broadcast_to(seen, S.shape)
    truth = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(d)
    assert np.isnan(S[~seen]).all()  # never written
    assert rel(S[seen], truth[seen]) <= TOL


def planted_truth(q_fwd, q_bwd, k, v, dO, causal, p, seed, offset, O):
    """Float64 gradients of a backward that takes P from the scores of q_fwd (what the forward
    stored) and everything else from q_bwd: dQ = scale dS K, dK = scale dS^T q_bwd,
    dV = P_dropped^T dO, dS = P (dP - D), D = rowsum(dO * O) with the O the forward kept."""
    q_fwd, q_bwd, k, v, dO, O = (x.astype(np.float64) for x in (q_fwd, q_bwd, k, v, dO, O))
    Nq, Nk, d = q_fwd.shape[2], k.shape[2], k.shape[3]
    scale = 1 / np.sqrt(d)
    S = scale * q_fwd @ k.swapaxes(-1, -2)
    if causal:
        S = np.where(ref.causal_visible(Nq, Nk), S, -np.inf)
    m = S.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    P = np.exp(S - m)
    l = P.sum(-1, keepdims=True)
    P = P / np.where(l > 0, l, 1)
    keep = rng.keep_mask(seed, offset, P.shape, p) / (1 - p)
    dP = (dO @ v.swapaxes(-1, -2)) * keep
    dS = P * (dP - (dO * O).sum(-1, keepdims=True))
    return scale * dS @ k, scale * dS.swapaxes(-1, -2) @ q_bwd, (P * keep).swapaxes(-1, -2) @ dO


@pytest.mark.parametrize("causal,p", [(False, 0.0), (True, 0.2)])
def test_stored_backward_takes_p_from_s_never_from_q_k(causal, p):
    """A planted check: the forward runs on q1, the backward is handed q2. A backward that forms
    P from the stored S matches the float64 gradients of P(q1) with Q = q2 in dK; one that ran
    Q K^T would use q2 there too (flash does, and misses them by far: the check can fail)."""
    B, H, Nq, Nk, d = 1, 2, 37, 50, 32
    q1, k, v, dO = make_inputs(B, H, Nq, Nk, d, 2)
    q2 = make_inputs(B, H, Nq, Nk, d, 3)[0]
    kw = dict(causal=causal, dropout_p=p, seed=8, offset=1)
    for method in ("stored", "flash"):
        O, saved = kernels.forward(method, q1, k, v, **kw)
        planted = planted_truth(q1, q2, k, v, dO, causal, p, 8, 1, O)
        for deterministic in (False, True):
            grads = kernels.backward(method, dO, q2, k, v, saved, deterministic)
            errs = [rel(g, t) for g, t in zip(grads, planted, strict=True)]
            if method == "stored":
                assert max(errs) <= TOL, errs
            else:
                assert min(errs[:2]) > 1e-2, errs  # dQ, dK: flash recomputed S from q2


def test_backward_reads_exactly_the_entries_the_forward_wrote():
    """Forward and backward tiles differ ((64, 32) and (32, 32) at d = 16; (64, 16) and
    (16, 32) at d = 96), so a tile the backward visits may hold entries no forward tile wrote:
    those are never read. Counted: each backward kernel reads S once per written entry, and
    planting any value in the unwritten ones changes no bit of the gradients."""
    for Nq, Nk, d in ((70, 33, 16), (33, 70, 16), (40, 90, 96)):
        q, k, v, dO = make_inputs(1, 1, Nq, Nk, d, 5)
        _, saved = kernels.stored_forward(q, k, v, causal=True)
        S = saved.tensors["S"]
        written = np.isfinite(S)
        assert written.sum() == pair_counts.visible_pairs(Nq, Nk, True)
        for deterministic in (False, True):
            with emu.settings(mode="counted"), emu.record() as rec:
                grads = kernels.stored_backward(dO, q, k, v, saved, deterministic)
            for launch in rec.launches:
                if "preprocess" not in launch.kernel:
                    assert launch.args["S"].read_bytes == 4 * written.sum(), launch.kernel
            S[~written] = 1e30  # would dominate any softmax it entered
            again = kernels.stored_backward(dO, q, k, v, saved, deterministic)
            S[~written] = np.nan
            assert all(np.array_equal(a, b) for a, b in zip(grads, again, strict=True))


def test_stored_backward_runs_no_q_k_product():
    """Hardware FLOPs as modeled (and counted == modeled in bytes elsewhere): the stored backward
    is the flash backward less one Br x Bc x Dt product per tile pair (S = Q K^T), recompute 0
    with atomic dQ; with the deterministic dQ only dO V^T is redone. Its dq kernel reads no Q and
    its deterministic dK/dV kernel no K: they served only Q K^T (and K the atomic dQ)."""
    B, H, N, d = 1, 2, 128, 64
    tile = 32 * 32 * 64  # multiply-adds of one (Br, Bc, Dt) = (32, 32, 64) tile product
    pairs = B * H * (N // 32) ** 2
    for det in (False, True):
        flash = traffic.flash_backward_traffic(B, H, N, N, d, deterministic=det)
        stored = traffic.stored_backward_traffic(B, H, N, N, d, deterministic=det)
        for f, s in zip(flash[1:], stored[1:], strict=True):
            assert f.flops - s.flops == 2 * pairs * tile, f.kernel
        assert stored[1].recompute_flops == 0
        assert (stored[1].read["K"] == 0) == det
    assert stored[2].recompute_flops == 2 * pairs * tile and stored[2].read["Q"] == 0
    q, k, v, dO = make_inputs(B, H, 40, 40, d, 6)
    _, saved = kernels.stored_forward(q, k, v)
    with emu.settings(mode="counted"), emu.record() as rec:
        kernels.stored_backward(dO, q, k, v, saved, deterministic=True)
    dkdv, dq = rec.launches[1:]
    assert dkdv.args["K"].read_bytes == 0 and dq.args["Q"].read_bytes == 0


def test_stored_ledger():
    """stored keeps O, L and S (B, H, Nq, Nk): the N x N term naive has, in a fused kernel."""
    B, H, Nq, Nk, d = 2, 1, 30, 50, 16
    q, k, v, _ = make_inputs(B, H, Nq, Nk, d, 6)
    _, saved = kernels.stored_forward(q, k, v, causal=True, dropout_p=0.1, seed=3, offset=2)
    assert saved.method == "stored" and set(saved.tensors) == {"O", "L", "S"}
    assert saved.nbytes == 4 * B * H * (Nq * d + Nq + Nq * Nk)
    assert (saved.causal, saved.dropout_p, saved.seed, saved.offset) == (True, 0.1, 3, 2)


def test_bad_stored_input():
    """The same checks as flash, and a saved state of the other fused method is refused."""
    q, k, v, dO = make_inputs(1, 2, 9, 11, 16, 8)
    _, stored = kernels.stored_forward(q, k, v)
    _, flash = kernels.flash_forward(q, k, v)
    with emu.record() as rec:
        with pytest.raises(TypeError, match="what stored_forward returned, got flash"):
            kernels.stored_backward(dO, q, k, v, flash)
        with pytest.raises(TypeError, match="what flash_forward returned, got stored"):
            kernels.flash_backward(dO, q, k, v, stored)
        with pytest.raises(ValueError, match="dO must have shape"):
            kernels.stored_backward(dO[:, :, :5].copy(), q, k, v, stored)
        with pytest.raises(ValueError, match="saved was made for"):
            kernels.stored_backward(dO[:, :, :4].copy(), q[:, :, :4].copy(), k, v, stored)
        with pytest.raises(TypeError, match="deterministic must be a bool"):
            kernels.stored_backward(dO, q, k, v, stored, deterministic="yes")
        with pytest.raises(ValueError, match="multiple of 8"):
            kernels.stored_forward(q, k, v, tiles=(12, 16))
        with pytest.raises(ValueError, match=r"Br must be at most Bc \* 8 = 64"):
            kernels.stored_backward(dO, q, k, v, stored, tiles=(128, 8))
        with pytest.raises(ValueError, match="method must be one of"):
            kernels.forward("fused", q, k, v)
    assert rec.launches == []
