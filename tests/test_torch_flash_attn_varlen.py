"""ckptlab.torch.flash_attn_varlen: FlashAttention 2's variable-length interface.

Two oracles: (1) flash_attn_func on each sequence alone, which tests/test_torch_flash_attn.py
checks as flash_attn's own tests do; varlen must equal it bit for bit (out, softmax_lse, the
S_dmask block, every gradient), with the same dropout seeds drawn in the same order; (2) an
independent float64 reference over the packed tokens: one attention with a block-diagonal
mask (each sequence sees only its own keys, causal per sequence from its bottom-right corner),
which does not go through flash_attn_func at all. Also: the packed forms, empty sequences, and
the checks flash_attn leaves out (bad offsets, a max_seqlen below the longest sequence)
refused before any launch."""

import pytest
from test_torch_flash_attn import INF, check_rule, decode, hidden, max_err
from torch_oracle import torch  # skips this module without PyTorch

from ckptlab import emu
from ckptlab.torch import (
    flash_attn_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)

# per sequence (seqlen_q, seqlen_k): odd and even, q longer and shorter than k, one key only
LENGTHS = [(5, 7), (37, 37), (1, 20), (40, 9), (64, 1)]


def offsets(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def packed(dtype, lengths, H, Hk, d, seed=0):
    torch.random.manual_seed(seed)
    tq, tk = sum(a for a, _ in lengths), sum(b for _, b in lengths)
    q = torch.randn(tq, H, d, dtype=dtype, requires_grad=True)
    k = torch.randn(tk, Hk, d, dtype=dtype, requires_grad=True)
    v = torch.randn(tk, Hk, d, dtype=dtype, requires_grad=True)
    return q, k, v


CASES = [  # (dtype, nheads, nheads_k, d, causal, dropout_p)
    ("float16", 4, 4, 32, True, 0.0),
    ("float16", 4, 1, 64, False, 0.17),  # MQA
    ("bfloat16", 4, 2, 40, True, 0.17),  # GQA, a head dim that is not a power of 2
    ("float32", 2, 2, 59, True, 0.0),  # padded to 64, as flash_attn pads
    ("float32", 2, 1, 32, False, 0.0),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_varlen_is_flash_attn_func_on_each_sequence_bit_for_bit(case):
    dtype, H, Hk, d, causal, p = case
    tdtype = getattr(torch, dtype)
    q, k, v = packed(tdtype, LENGTHS, H, Hk, d)
    cu_q, cu_k = offsets([a for a, _ in LENGTHS]), offsets([b for _, b in LENGTHS])
    max_q, max_k = max(a for a, _ in LENGTHS), max(b for _, b in LENGTHS)
    with emu.settings(mode="fast"):
        torch.manual_seed(7)
        out, lse, S_dmask = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, p,
                                                   causal=causal, deterministic=True,
                                                   return_attn_probs=True)
        g = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), g)

        assert out.shape == q.shape and out.dtype == tdtype
        assert lse.shape == (H, q.shape[0]) and lse.dtype == torch.float32
        assert S_dmask.shape == (len(LENGTHS), H, 128, 128) and S_dmask.dtype == tdtype

        torch.manual_seed(7)  # the same seeds, drawn in the same order
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        for i, (nq, nk) in enumerate(LENGTHS):
            sq, sk = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
            o, l, s = flash_attn_func(leaves[0][None, sq], leaves[1][None, sk],
                                      leaves[2][None, sk], p, causal=causal, deterministic=True,
                                      return_attn_probs=True)
            o.backward(g[None, sq])
            assert torch.equal(out[sq], o[0]), f"sequence {i}: out"
            assert torch.equal(lse[:, sq], l[0]), f"sequence {i}: softmax_lse"
            assert torch.equal(S_dmask[i, :, :nq, :nk], s[0, :, :nq, :nk]), f"sequence {i}"
            assert not S_dmask[i, :, nq:].any() and not S_dmask[i, :, :, nk:].any()
    for name, got, want in zip(("dQ", "dK", "dV"), grads, (t.grad for t in leaves),
                               strict=True):
        assert torch.equal(got, want), name

    if p > 0:  # each sequence's mask decodes to its own dropout, near p overall
        dropped = visible = 0
        for i, (nq, nk) in enumerate(LENGTHS):
            sq, sk = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
            mask, _ = decode(S_dmask[i:i + 1], q[None, sq], k[None, sk], causal, p)
            seen = ~hidden(nq, nk) if causal else torch.ones(nq, nk, dtype=torch.bool)
            dropped += int((~mask & seen).sum())
            visible += int(seen.sum()) * H
        assert abs(dropped / visible - p) < 0.03, (dropped / visible, p)


def zero_bound(q, k, v, dO) -> float:
    """|dS| <= 2 d eps ||dO|| ||V|| (dP and D: two fp32 sums of the same d products when every
    row sees one key), so |dQ| <= scale |dS| ||K||, |dK| <= scale |dS| ||Q||: the larger."""
    d, eps = q.shape[-1], torch.finfo(torch.float32).eps
    ds = 2 * d * eps * float(dO.detach().double().norm() * v.detach().double().norm())
    return ds * max(float(k.detach().double().norm()), float(q.detach().double().norm())) / d**0.5


def block_diagonal_reference(q, k, v, lengths, causal, dtype):
    """Attention over the packed tokens in `dtype` with one mask: query t sees key s only in
    its own sequence (and, causal, not past its sequence's bottom-right diagonal)."""
    seq_q = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor([a for a, _ in
                                                                              lengths]))
    seq_k = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor([b for _, b in
                                                                              lengths]))
    allowed = seq_q[:, None] == seq_k[None, :]
    if causal:
        pos_q = torch.cat([torch.arange(a) + (b - a) for a, b in lengths])  # bottom-right
        pos_k = torch.cat([torch.arange(b) for _, b in lengths])
        allowed &= pos_k[None, :] <= pos_q[:, None]
    g = q.shape[1] // k.shape[1]
    kk, vv = (t.to(dtype).repeat_interleave(g, dim=1) for t in (k, v))
    S = torch.einsum("thd,shd->hts", q.to(dtype) * q.shape[-1] ** -0.5, kk)
    S = S.masked_fill(~allowed, -INF)
    sees = allowed.any(-1)[None, :, None]
    P = torch.softmax(S.masked_fill(~sees, 0.0), dim=-1) * sees
    return torch.einsum("hts,shd->thd", P, vv), torch.logsumexp(S, dim=-1)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_varlen_against_a_block_diagonal_float64_reference(causal, dtype):
    tdtype = getattr(torch, dtype)
    q, k, v = packed(tdtype, LENGTHS, 4, 2, 48, seed=1)
    cu_q, cu_k = offsets([a for a, _ in LENGTHS]), offsets([b for _, b in LENGTHS])
    with emu.settings(mode="fast"):
        out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 64, 37, causal=causal,
                                             return_attn_probs=True)
        g = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), g)
    leaves64 = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    out64, lse64 = block_diagonal_reference(*leaves64, LENGTHS, causal, torch.float64)
    out_pt, _ = block_diagonal_reference(q, k, v, LENGTHS, causal, tdtype)
    grads64 = torch.autograd.grad(out64, leaves64, g.double())
    grads_pt = torch.autograd.grad(out_pt, (q, k, v), g)
    for i in range(len(LENGTHS)):  # the rule per sequence: each has its own scale
        sq, sk = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        check_rule(f"out {i}", out[sq], out64[sq], out_pt[sq])
        for name, x, t, y, rows in zip(("dQ", "dK", "dV"), grads, grads64, grads_pt,
                                       (sq, sk, sk), strict=True):
            if t[rows].any():
                check_rule(f"{name} {i}", x[rows], t[rows], y[rows])
            else:  # one key: dS = P (dP - D) is 0 in exact math, two fp32 sums that cancel
                assert max_err(x[rows], t[rows]) <= zero_bound(q[sq], k[sk], v[sk], g[sq]), name
    lse64 = lse64.masked_fill(lse64 == -INF, INF)
    assert torch.equal(torch.isinf(lse), torch.isinf(lse64))
    finite = torch.isfinite(lse64)
    torch.testing.assert_close(lse.double()[finite], lse64[finite], rtol=1e-5, atol=1e-5)


def test_packed_forms_and_empty_sequences():
    lengths = [(6, 6), (0, 0), (11, 11), (3, 3)]
    cu = offsets([a for a, _ in lengths])
    torch.manual_seed(0)
    qkv = torch.randn(int(cu[-1]), 3, 2, 16, dtype=torch.float16, requires_grad=True)
    g = torch.randn(int(cu[-1]), 2, 16, dtype=torch.float16)
    kw = dict(dropout_p=0.1, causal=True, deterministic=True)
    with emu.settings(mode="fast"):
        torch.manual_seed(3)
        out = flash_attn_varlen_qkvpacked_func(qkv, cu, 11, **kw)
        out.backward(g)
        parts = [t.detach().clone().requires_grad_(True) for t in qkv.unbind(dim=1)]
        torch.manual_seed(3)
        want = flash_attn_varlen_func(*parts, cu, cu, 11, 11, **kw)
        want.backward(g)
        assert torch.equal(out, want)
        assert torch.equal(qkv.grad, torch.stack([t.grad for t in parts], dim=1))

        kv = qkv.detach()[:, 1:].clone().requires_grad_(True)
        q = qkv.detach()[:, 0].clone().requires_grad_(True)
        torch.manual_seed(3)
        out = flash_attn_varlen_kvpacked_func(q, kv, cu, cu, 11, 11, **kw)
        out.backward(g)
        assert torch.equal(out, want) and torch.equal(q.grad, parts[0].grad)
        assert torch.equal(kv.grad, torch.stack([t.grad for t in parts[1:]], dim=1))

        # queries whose sequence has no key: out 0, softmax_lse +inf, no gradient
        q, k, v = packed(torch.float32, [(4, 0), (3, 5)], 2, 2, 16)
        out, lse, S = flash_attn_varlen_func(q, k, v, offsets([4, 3]), offsets([0, 5]), 4, 5,
                                             return_attn_probs=True)
        out.sum().backward()
        assert not out[:4].any() and torch.isinf(lse[:, :4]).all() and not S[0].any()
        assert torch.isfinite(lse[:, 4:]).all() and not q.grad[:4].any() and q.grad[4:].any()


def test_bad_offsets_and_unsupported_arguments_are_refused_before_any_launch():
    q, k, v = (t.detach() for t in packed(torch.float16, [(5, 7), (3, 2)], 4, 2, 32))
    cu_q, cu_k = offsets([5, 3]), offsets([7, 2])
    cases = [
        (dict(cu_seqlens_q=cu_q.float()), TypeError, "cu_seqlens_q must hold integers"),
        (dict(cu_seqlens_k=[0, 7, 9]), TypeError, "cu_seqlens_k must be a torch.Tensor"),
        (dict(cu_seqlens_q=torch.tensor([1, 5, 8])), ValueError, "must start at 0, got 1"),
        (dict(cu_seqlens_q=torch.tensor([0, 6, 5, 8])), ValueError, "must never decrease"),
        (dict(cu_seqlens_k=torch.tensor([0, 7, 8])), ValueError,
         r"cu_seqlens_k must end at the number of tokens in k \(9\), got 8"),
        (dict(cu_seqlens_q=torch.tensor([0, 8])), ValueError,
         r"batch_size \+ 1 offsets each, got 2 and 3"),
        (dict(cu_seqlens_q=torch.tensor([8])), ValueError, r"shape \(batch_size \+ 1,\)"),
        (dict(max_seqlen_q=4), ValueError, r"max_seqlen_q=4 is less than the longest sequence "
         r"\(5\)"),
        (dict(max_seqlen_k=7.0), TypeError, "max_seqlen_k must be an int, got float"),
        (dict(block_table=torch.zeros(2, 1, dtype=torch.int32)), NotImplementedError,
         "block_table"),
        (dict(window_size=(8, 0)), NotImplementedError, "window_size"),
        (dict(softcap=5.0), NotImplementedError, "softcap"),
        (dict(q=q[None]), ValueError, r"q must have shape \(total_q, nheads, headdim\)"),
        (dict(v=v[:, :1]), ValueError, "v must have the shape of k"),
        (dict(q=q.float()), TypeError, "k must have dtype float32, got float16"),
    ]
    base = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=5,
                max_seqlen_k=7)
    with emu.record() as rec:
        for change, error, message in cases:
            with pytest.raises(error, match=message):
                flash_attn_varlen_func(**{**base, **change})
        with pytest.raises(ValueError, match=r"qkv must have shape \(total, 3, nheads"):
            flash_attn_varlen_qkvpacked_func(torch.stack([k, v], dim=1), cu_k, 7)
        with pytest.raises(ValueError, match=r"kv must have shape \(total_k, 2, nheads_k"):
            flash_attn_varlen_kvpacked_func(q, k, cu_q, cu_k, 5, 7)
    assert rec.launches == []
