"""ckptlab.torch.flash_attn checked as FlashAttention 2's own tests (tests/test_flash_attn.py,
test_flash_attn_output) check flash_attn_func, on the emulator.

For each case: q (batch, seqlen_q, nheads, d), k and v with nheads_k = nheads, nheads / 2 or 1
(MHA, GQA, MQA), torch.randn after torch.random.manual_seed(0); out, softmax_lse, S_dmask =
flash_attn_func(..., return_attn_probs=True); then, as flash_attn's tests do:
- S_dmask is cropped to (seqlen_q, seqlen_k), dropout_mask = S_dmask >= 0, and its absolute
  value normalized per key block (their normalize_flash_attn_S: block n times exp(m_n - lse),
  m_n the row's largest score in blocks n, n+1, ..., the block size their _get_block_size_n's
  on an sm80 / sm90 GPU); the fraction dropped must be dropout_p's;
- the reference attention_ref(q, k, v, dropout_mask=the decoded mask) is run twice: in float64
  (the truth; flash_attn upcasts to float32, ckptlab's other tests use float64) and in the
  inputs' dtype, each op rounding to it (flash_attn's upcast=False, the yardstick);
- out, the decoded attention, dQ, dK, dV: max |x - truth| <= 2 max |yardstick - truth| + SLACK,
  flash_attn's rule, SLACK = 2^-22 max |truth| (a few fp32 roundings: the kernels accumulate in
  fp32, and the 16-bit yardstick can be exact where a row sees one key).
softmax_lse is checked against float64's logsumexp (+inf for a row that sees no key), shapes,
dtypes and the rounding of S_dmask to multiples of 128 (zero padding) too. The reference and
the decoder are written here from flash_attn's conventions; the decoded dropout mask must be
the kernel's own, or out misses the reference by O(1).
Also: the packed forms against flash_attn_func (bitwise, gradients summed into the packed
tensor), the dropout seed from torch's generator, and the errors (NotImplementedError naming
window_size, softcap or alibi_slopes; bad shapes before any launch)."""

import math

import pytest
from torch_oracle import torch  # skips this module without PyTorch

from ckptlab import emu
from ckptlab.torch import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func

F = torch.nn.functional
INF = float("inf")

# (dtype, batch, seqlen_q, seqlen_k, nheads, nheads_k, d, causal, dropout_p)
CASES = [
    ("float16", 2, 37, 50, 4, 4, 32, False, 0.0),
    ("float16", 2, 50, 23, 4, 1, 64, True, 0.17),  # MQA; 27 rows see no key (bottom-right)
    ("float16", 1, 17, 23, 2, 1, 59, True, 0.0),  # d = 59: padded to 64, as flash_attn pads
    ("float16", 1, 129, 20, 1, 1, 32, True, 0.17),  # S_dmask rounded to 256 x 128
    ("bfloat16", 2, 37, 50, 4, 2, 64, True, 0.0),  # GQA
    ("bfloat16", 1, 48, 100, 4, 2, 64, False, 0.17),  # two key blocks of 64 in S_dmask
    ("float32", 2, 37, 150, 4, 2, 32, True, 0.17),  # two key blocks of 128
    ("float32", 1, 50, 37, 2, 1, 64, False, 0.0),
]


def case_id(c):
    dtype, B, Nq, Nk, H, Hk, d, causal, p = c
    return f"{dtype}-B{B}-Nq{Nq}-Nk{Nk}-H{H}-Hk{Hk}-d{d}-{'causal' if causal else 'full'}-p{p}"


def fa_block_size_n(d: int, is_dropout: bool) -> int:
    """flash_attn's _get_block_size_n on an sm80 or sm90 GPU (is_causal matters on sm86/89
    only): the key block size its forward kernel scales S_dmask by."""
    if d <= 32:
        return 128
    if d <= 64:
        return 64 if is_dropout else 128
    if d <= 96:
        return 64
    if d <= 128:
        return 32 if is_dropout else 64
    return 64


def hidden(Nq, Nk):
    """(Nq, Nk) bool, True where causal masking hides key j from query i (bottom-right)."""
    return torch.arange(Nk)[None, :] > torch.arange(Nq)[:, None] + (Nk - Nq)


def scores(q, k, causal, dtype):
    """q k^T / sqrt(d) (batch, nheads, seqlen_q, seqlen_k) in `dtype`, k's heads repeated for
    MQA / GQA, hidden entries -inf."""
    g = q.shape[2] // k.shape[2]
    S = torch.einsum("bthd,bshd->bhts", q.to(dtype) / math.sqrt(q.shape[-1]),
                     k.to(dtype).repeat_interleave(g, dim=2))
    return S.masked_fill(hidden(*S.shape[-2:]), -INF) if causal else S


def attention_ref(q, k, v, causal, dropout_mask=None, dropout_p=0.0, dtype=torch.float64):
    """flash_attn's attention_ref in `dtype`: out (batch, seqlen_q, nheads, d) and the
    attention (batch, nheads, seqlen_q, seqlen_k) before dropout; a row that sees no key: 0."""
    S = scores(q, k, causal, dtype)
    sees = ~torch.isinf(S).all(-1, keepdim=True)
    P = torch.softmax(S.masked_fill(~sees, 0.0), dim=-1) * sees  # no NaN, even in the gradient
    dropped = P if dropout_mask is None else P.masked_fill(~dropout_mask, 0.0)
    g = q.shape[2] // v.shape[2]
    out = torch.einsum("bhts,bshd->bthd", dropped,
                       v.to(dtype).repeat_interleave(g, dim=2) / (1 - dropout_p))
    return out, P


def decode(S_dmask, q, k, causal, dropout_p):
    """What flash_attn's tests make of S_dmask: (dropout_mask, attention)."""
    Nq, Nk = q.shape[1], k.shape[1]
    S = S_dmask[:, :, :Nq, :Nk]  # convert_flash_attn_S_to_softmax, no padding masks
    dropout_mask = S >= 0
    s = scores(q.detach(), k.detach(), causal, torch.float32)
    n = fa_block_size_n(q.shape[-1], dropout_p > 0)
    lse = torch.logsumexp(s, dim=-1)
    lse = lse.masked_fill(lse == -INF, INF)
    block_max = torch.stack([b.amax(-1) for b in s.split(n, dim=-1)], dim=-1)
    m = torch.cummax(block_max.flip(-1), dim=-1).values.flip(-1)
    attn = torch.cat([a.float() * torch.exp(m[..., i] - lse)[..., None]
                      for i, a in enumerate(S.abs().split(n, dim=-1))], dim=-1)
    return dropout_mask, attn.to(S_dmask.dtype)


def max_err(x, truth) -> float:
    return float((x.detach().double() - truth.detach().double()).abs().max())


def check_rule(name, got, truth, yardstick):
    err, err_pt = max_err(got, truth), max_err(yardstick, truth)
    slack = 2.0**-22 * float(truth.detach().abs().max())
    print(f"{name}: max err {err:.2e}, PyTorch in the same dtype {err_pt:.2e}")
    assert err <= 2 * err_pt + slack, f"{name}: {err:.3e} > 2 x {err_pt:.3e} + {slack:.1e}"


def make(dtype, B, Nq, Nk, H, Hk, d):
    torch.random.manual_seed(0)
    q = torch.randn(B, Nq, H, d, dtype=dtype, requires_grad=True)
    k = torch.randn(B, Nk, Hk, d, dtype=dtype, requires_grad=True)
    v = torch.randn(B, Nk, Hk, d, dtype=dtype, requires_grad=True)
    return q, k, v


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_flash_attn_func_as_flash_attns_tests_check_it(case):
    dtype, B, Nq, Nk, H, Hk, d, causal, p = case
    tdtype = getattr(torch, dtype)
    q, k, v = make(tdtype, B, Nq, Nk, H, Hk, d)
    with emu.settings(mode="fast"):
        out, lse, S_dmask = flash_attn_func(q, k, v, p, causal=causal, return_attn_probs=True)
        g = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), g)

    assert out.shape == q.shape and out.dtype == tdtype and out.is_contiguous()
    assert lse.shape == (B, H, Nq) and lse.dtype == torch.float32 and not lse.requires_grad
    rounded = (B, H, -(-Nq // 128) * 128, -(-Nk // 128) * 128)
    assert S_dmask.shape == rounded and S_dmask.dtype == tdtype
    assert not S_dmask[:, :, Nq:].any() and not S_dmask[..., Nk:].any()

    dropout_mask, attn = decode(S_dmask, q, k, causal, p)
    if p > 0:
        visible = ~hidden(Nq, Nk) if causal else torch.ones(Nq, Nk, dtype=torch.bool)
        fraction = float((~dropout_mask & visible).sum() / (visible.sum() * B * H))
        assert abs(fraction - p) < 0.02, f"dropout fraction {fraction:.3f}, p = {p}"
    else:  # flash_attn returns an empty S_dmask here; ckptlab returns it, nothing dropped
        assert dropout_mask.all()
        dropout_mask = None

    leaves64 = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    out64, attn64 = attention_ref(*leaves64, causal, dropout_mask, p)
    out_pt, attn_pt = attention_ref(q, k, v, causal, dropout_mask, p, dtype=tdtype)
    check_rule("out", out, out64, out_pt)
    check_rule("attention", attn, attn64, attn_pt)
    grads64 = torch.autograd.grad(out64, leaves64, g.double())
    grads_pt = torch.autograd.grad(out_pt, (q, k, v), g)
    for name, x, t, y in zip(("dQ", "dK", "dV"), grads, grads64, grads_pt, strict=True):
        assert x.shape == t.shape and x.dtype == tdtype, name
        check_rule(name, x, t, y)

    lse64 = torch.logsumexp(scores(q.detach(), k.detach(), causal, torch.float64), dim=-1)
    lse64 = lse64.masked_fill(lse64 == -INF, INF)  # flash_attn's +inf for a row with no key
    assert torch.equal(torch.isinf(lse), torch.isinf(lse64))
    finite = torch.isfinite(lse64)
    torch.testing.assert_close(lse.double()[finite], lse64[finite], rtol=1e-5, atol=1e-5)


def test_packed_forms_are_flash_attn_func_with_gradients_summed_into_the_pack():
    B, N, Nk, H, Hk, d = 2, 33, 21, 4, 2, 32
    qkv = torch.randn(B, N, 3, H, d, dtype=torch.bfloat16, requires_grad=True)
    kv = torch.randn(B, Nk, 2, Hk, d, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(B, N, H, d, dtype=torch.bfloat16)
    kw = dict(dropout_p=0.1, causal=True, deterministic=True)

    def unpacked(pack, q=None):
        parts = [t.detach().clone().requires_grad_(True) for t in pack.unbind(dim=2)]
        q = parts.pop(0) if q is None else q.detach().clone().requires_grad_(True)
        torch.manual_seed(3)
        out = flash_attn_func(q, *parts, **kw)
        out.backward(g)
        return out, torch.stack([t.grad for t in parts], dim=2), q.grad

    with emu.settings(mode="fast"):
        torch.manual_seed(3)
        out = flash_attn_qkvpacked_func(qkv, **kw)
        out.backward(g)
        want, dkv, dq = unpacked(qkv)
        assert torch.equal(out, want)
        assert torch.equal(qkv.grad, torch.cat([dq[:, :, None], dkv], dim=2))

        q = qkv.detach()[:, :, 0].clone().requires_grad_(True)
        torch.manual_seed(3)
        out = flash_attn_kvpacked_func(q, kv, **kw)
        out.backward(g)
        want, dkv, dq = unpacked(kv, q)
        assert torch.equal(out, want) and torch.equal(kv.grad, dkv) and torch.equal(q.grad, dq)
        assert kv.grad.shape == kv.shape


def test_dropout_seed_comes_from_torchs_generator():
    q, k, v = (t.detach() for t in make(torch.float16, 1, 20, 20, 2, 1, 32))
    runs = []
    with emu.settings(mode="fast"):
        for s in (1, 1, 2):
            torch.manual_seed(s)
            runs.append(flash_attn_func(q, k, v, 0.5))
        assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])
        state = torch.get_rng_state()
        flash_attn_func(q, k, v)
        assert torch.equal(torch.get_rng_state(), state)  # dropout_p = 0 draws nothing


def test_unsupported_arguments_and_bad_inputs_are_refused_before_any_launch():
    q, k, v = (t.detach() for t in make(torch.float16, 1, 9, 11, 4, 2, 32))
    qkv = torch.stack([q, q, q], dim=2)
    kv = torch.stack([k, v], dim=2)
    cases = [
        (lambda: flash_attn_func(q, k, v, window_size=(4, 0)), NotImplementedError,
         r"window_size=\(4, 0\): sliding-window"),
        (lambda: flash_attn_func(q, k, v, window_size=torch.tensor([3, 5])),
         NotImplementedError, "window_size"),
        (lambda: flash_attn_func(q, k, v, softcap=30.0), NotImplementedError, "softcap=30.0"),
        (lambda: flash_attn_func(q, k, v, alibi_slopes=torch.rand(4)), NotImplementedError,
         "alibi_slopes"),
        (lambda: flash_attn_qkvpacked_func(qkv, softcap=-1.0), NotImplementedError, "softcap"),
        (lambda: flash_attn_kvpacked_func(q, kv, window_size=(-1, 8)), NotImplementedError,
         "window_size"),
        (lambda: flash_attn_func(q, k, v, window_size=None), TypeError, "window_size must be"),
        (lambda: flash_attn_func(q, *(t.repeat(1, 1, 2, 1)[:, :, :3] for t in (k, v))),
         ValueError, r"key/value heads \(3\) must divide the number of query heads \(4\)"),
        (lambda: flash_attn_func(q[0], k, v), ValueError,
         r"q must have shape \(batch, seqlen, nheads, headdim\) \(rank 4\)"),
        (lambda: flash_attn_func(q, k, v[:, :5]), ValueError, "v must have the shape of k"),
        (lambda: flash_attn_func(q, k[..., :16], v[..., :16]), ValueError,
         r"k must have shape \(batch, seqlen_k, nheads_k, headdim\) = \(1, seqlen_k, "
         r"nheads_k, 32\)"),
        (lambda: flash_attn_func(*(torch.zeros(1, 3, 1, 264, dtype=torch.float16),) * 3),
         ValueError, r"headdim must be in \[1, 256\], got 264"),
        (lambda: flash_attn_func(q.double(), k.double(), v.double()), TypeError,
         "q must have dtype float32"),
        (lambda: flash_attn_func(q.float(), k, v), TypeError,
         "k must have dtype float32, got float16"),
        (lambda: flash_attn_func(q, k, v, 1.0), ValueError, "dropout_p"),
        (lambda: flash_attn_func(q, k, v, softmax_scale=float("nan")), ValueError, "scale"),
        (lambda: flash_attn_func(q.numpy(), k, v), TypeError, "q must be a torch.Tensor"),
        (lambda: flash_attn_qkvpacked_func(kv), ValueError,
         r"qkv must have shape \(batch, seqlen, 3, nheads, headdim\)"),
        (lambda: flash_attn_kvpacked_func(q, qkv), ValueError,
         r"kv must have shape \(batch, seqlen_k, 2, nheads_k, headdim\)"),
    ]
    with emu.record() as rec:
        for fn, error, message in cases:
            with pytest.raises(error, match=message):
                fn()
    assert rec.launches == []


def test_s_dmask_is_not_in_the_graph_and_out_is_the_only_differentiable_output():
    q, k, v = make(torch.float32, 1, 16, 16, 2, 2, 32)
    with emu.settings(mode="fast"):
        out, lse, S_dmask = flash_attn_func(q, k, v, 0.2, return_attn_probs=True)
    assert out.requires_grad and not lse.requires_grad and not S_dmask.requires_grad
    assert (S_dmask < 0).any()  # something dropped, and flagged by its sign
