"""Stanford CS336 (assignment 2)'s FlashAttention tests, as a student's autograd.Function meets
them, run on ckptlab.torch.FlashAttention (and StoredAttention, NaiveAttention): 3-D inputs
(batch, n_queries, d), `.apply(q, k, v, is_causal)`, the logsumexp L found as the one tensor of
shape (batch, n_queries) among `o.grad_fn.saved_tensors`, O, L and the gradients against a
reference within rtol = atol = 1e-2 (CS336's tolerance), and in float32 within 1e-5 (ckptlab's
kernels are within ~1e-6 of float64 there).

The reference is written here, in float64, as CS336's is: S = q k^T / sqrt(d), causal entries
j > i set to -1e6 (top-left; the same mask as ckptlab's bottom-right when Nq == Nk),
O = softmax(S) v, L = logsumexp(S). Also: 3-D inputs through ckptlab.torch.attention keep
zero copies (the kernels read q's own memory, saved_tensors_hooks see the inputs' storages),
and a rank mismatch is refused."""

import numpy as np
import pytest
from torch_oracle import oracle, torch  # skips this module without PyTorch

from ckptlab import emu, kernels
from ckptlab.torch import FlashAttention, NaiveAttention, StoredAttention, attention

FUNCTIONS = {"flash": FlashAttention, "stored": StoredAttention, "naive": NaiveAttention}


def make_inputs(B, Nq, Nk, d, dtype=torch.float32, seed=0):
    """CS336's inputs: torch.randn after torch.random.manual_seed, requires_grad (cast to
    `dtype` first, so the reference sees the very same values)."""
    torch.random.manual_seed(seed)
    q, k, v = (torch.randn(B, n, d).to(dtype).requires_grad_(True) for n in (Nq, Nk, Nk))
    return q, k, v, torch.randn(B, Nq, d).to(dtype)


def reference(q, k, v, is_causal):
    """CS336's attention and logsumexp, in float64."""
    q, k, v = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    S = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if is_causal:
        i, j = torch.arange(S.shape[-2])[:, None], torch.arange(S.shape[-1])[None, :]
        S = torch.where(i >= j, S, -1e6)
    return torch.softmax(S, dim=-1) @ v, torch.logsumexp(S, dim=-1), (q, k, v)


def run(fn, q, k, v, dO, is_causal):
    o = fn.apply(q, k, v, is_causal)
    assert o.grad_fn.saved_tensors is not None
    maybe_ls = [t for t in o.grad_fn.saved_tensors if t.shape == (q.shape[0], q.shape[1])]
    assert len(maybe_ls) == 1, [tuple(t.shape) for t in o.grad_fn.saved_tensors]
    L = maybe_ls[0]
    o.backward(dO)
    return o, L, (q.grad, k.grad, v.grad)


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("float16", 1e-2)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_cs336_forward_and_backward(is_causal, dtype, tol):
    """CS336's sizes (4 x 128 x 64): L is the one (batch, n_queries) saved tensor; O, L, dQ,
    dK, dV within CS336's rtol = atol = 1e-2 of float64, and float32 within 1e-5."""
    tdtype = getattr(torch, dtype)
    q, k, v, dO = make_inputs(4, 128, 128, 64, tdtype)
    with emu.settings(mode="fast"):
        o, L, grads = run(FlashAttention, q, k, v, dO, is_causal)
    o_ref, L_ref, leaves = reference(q, k, v, is_causal)
    o_ref.backward(dO.double())
    assert o.shape == (4, 128, 64) and o.dtype == tdtype
    assert L.dtype == torch.float32  # fp32 statistics whatever the inputs' dtype
    truth = (o_ref, L_ref, *(t.grad for t in leaves))
    for name, got, want in zip(("O", "L", "dQ", "dK", "dV"), (o, L, *grads), truth, strict=True):
        assert got.shape == want.shape, name
        torch.testing.assert_close(got.double(), want, rtol=1e-2, atol=1e-2, msg=name)
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol, msg=name)


@pytest.mark.parametrize("method", ["stored", "naive"])
def test_the_other_methods_take_the_same_call(method):
    """StoredAttention and NaiveAttention: the same call; L is still the one (batch,
    n_queries) tensor for stored (S is (batch, Nq, Nk)); naive saves P (batch, Nq, Nk) and no L,
    so CS336's search finds none there (it is not FlashAttention); both agree with float64."""
    q, k, v, dO = make_inputs(2, 33, 33, 32, seed=1)
    o = FUNCTIONS[method].apply(q, k, v, True)
    saved = [tuple(t.shape) for t in o.grad_fn.saved_tensors]
    want = {"stored": [(2, 33, 32)] * 4 + [(2, 33), (2, 33, 33)],
            "naive": [(2, 33, 32)] * 3 + [(2, 33, 33)]}[method]
    assert saved == want
    o.backward(dO)
    o_ref, _, leaves = reference(q, k, v, True)
    o_ref.backward(dO.double())
    for name, got, ref in zip(("O", "dQ", "dK", "dV"), (o, q.grad, k.grad, v.grad),
                              (o_ref, *(t.grad for t in leaves)), strict=True):
        torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("method", ["naive", "stored", "flash"])
def test_3d_inputs_are_one_head_without_copies(method, monkeypatch):
    """attention() on (B, N, d): the kernels get (B, 1, N, d) views of q, k, v's own memory;
    saved_tensors_hooks see q, k, v themselves and the Saved set at the caller's rank (flash's
    O the output itself); Nq != Nk with bottom-right causal matches the 4-D result and the
    float64 oracle."""
    B, Nq, Nk, d = 2, 40, 17, 16
    q, k, v, dO = make_inputs(B, Nq, Nk, d, seed=2)
    seen = []
    launch = getattr(kernels, f"{method}_forward")

    def spy(*arrays, **kw):
        seen.extend(a.ctypes.data for a in arrays)
        assert all(a.shape[1] == 1 for a in arrays)
        return launch(*arrays, **kw)

    monkeypatch.setattr(kernels, f"{method}_forward", spy)
    packed = []

    def pack(t):
        packed.append(t)
        return t

    kw = dict(causal=True, dropout_p=0.2, seed=5, method=method)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        O = attention(q, k, v, **kw)
    assert seen == [t.data_ptr() for t in (q, k, v)]  # no copy on the way in
    assert O.shape == (B, Nq, d)
    ptr = lambda t: t.untyped_storage().data_ptr()  # noqa: E731
    assert [ptr(t) for t in packed[:3]] == [ptr(q), ptr(k), ptr(v)]
    shapes = {"naive": [(B, Nq, Nk)], "stored": [(B, Nq, d), (B, Nq), (B, Nq, Nk)],
              "flash": [(B, Nq, d), (B, Nq)]}[method]
    assert [tuple(t.shape) for t in packed[3:]] == shapes
    if method != "naive":
        assert ptr(packed[3]) == ptr(O)
    O.backward(dO)
    monkeypatch.undo()
    four = [t.detach()[:, None].clone().requires_grad_(True) for t in (q, k, v)]
    O4 = attention(*four, **kw)
    O4.backward(dO[:, None])
    assert torch.equal(O4[:, 0], O)
    for a, b in zip((q, k, v), four, strict=True):
        assert a.grad.shape == a.shape and torch.equal(a.grad, b.grad[:, 0])
    with torch.no_grad():
        truth = oracle(*(t.detach()[:, None].double() for t in (q, k, v)), causal=True,
                       dropout_p=0.2, seed=5)[:, 0]
    assert float((O.detach().double() - truth).norm() / truth.norm()) < 1e-5


def test_rank_errors():
    q, k, v, _ = make_inputs(2, 9, 9, 16)
    with emu.record() as rec:
        with pytest.raises(ValueError, match=r"k must have rank 3 \(B, N, d\) like q"):
            attention(q, k[:, None], v)
        with pytest.raises(ValueError, match=r"q must have rank 4 \(B, H, N, d\) or 3"):
            attention(q[0], k[0], v[0])
        with pytest.raises(ValueError, match="v must have rank 3"):
            FlashAttention.apply(q, k, v[None], False)
        with pytest.raises(TypeError, match="causal must be a bool"):
            FlashAttention.apply(q, k, v, "yes")
    assert rec.launches == []


def test_cs336_search_finds_no_second_candidate_when_d_equals_nk():
    """Even when a 3-D saved tensor could be mistaken for another (d == Nk, Nq == B), exactly
    one saved tensor has shape (batch, n_queries)."""
    q, k, v, _ = make_inputs(3, 3, 16, 16)
    o = FlashAttention.apply(q, k, v, False)
    assert [tuple(t.shape) for t in o.grad_fn.saved_tensors].count((3, 3)) == 1
    assert np.isfinite(o.detach().numpy()).all()
