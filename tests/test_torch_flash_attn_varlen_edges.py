"""flash_attn_varlen_func where its conventions can be got backwards without the bit-for-bit
tests of tests/test_torch_flash_attn_varlen.py noticing: the softmax_lse of a query that sees no
key is +inf, as FlashAttention returns it (not -inf, though logsumexp of nothing is -inf), both
for a sequence with no keys and for causal rows above the diagonal; and S_dmask is (batch,
nheads, round128(max_seqlen_q), round128(max_seqlen_k)) when the two round to different
multiples of 128, each sequence's block in its top-left corner."""

import pytest

from ckptlab import emu


def offsets(torch, lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def packed(torch, lengths, H, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    tq, tk = sum(a for a, _ in lengths), sum(b for _, b in lengths)
    return tuple(torch.randn(n, H, d, dtype=dtype, generator=g).requires_grad_(True)
                 for n in (tq, tk, tk))


def test_a_query_that_sees_no_key_has_softmax_lse_plus_inf(torch):
    """Sequence 0 has no keys; sequence 1 is causal with 6 queries and 2 keys, so its first 4
    rows (bottom-right aligned) see none. Every such row: out 0, lse +inf, no gradient."""
    from ckptlab.torch import flash_attn_varlen_func  # after the torch fixture: it needs PyTorch

    lengths = [(4, 0), (6, 2), (3, 5)]
    q, k, v = packed(torch, lengths, 2, 16, torch.float32, seed=1)
    cu_q, cu_k = offsets(torch, [a for a, _ in lengths]), offsets(torch, [b for _, b in lengths])
    with emu.settings(mode="fast"):
        out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 5, causal=True,
                                             return_attn_probs=True)
        out.backward(torch.randn_like(out))
    blind = torch.zeros(q.shape[0], dtype=torch.bool)
    blind[:4] = True  # sequence 0: no keys at all
    blind[4:8] = True  # sequence 1: rows 0..3 see keys j <= i + 2 - 6 < 0
    assert torch.equal(lse[:, blind], torch.full_like(lse[:, blind], float("inf")))
    assert torch.isfinite(lse[:, ~blind]).all()
    assert not out[blind].any() and out[~blind].abs().sum() > 0
    assert not q.grad[blind].any() and q.grad[~blind].abs().sum() > 0


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_s_dmask_when_max_seqlen_q_and_k_round_to_different_multiples(torch, dtype):
    """max_seqlen_q = 130 (-> 256 rows) against max_seqlen_k = 20 (-> 128 columns), and the
    other way round: the shape, each sequence's block equal to flash_attn_func's bit for bit
    (the same dropout seeds, drawn in the same order), zeros elsewhere."""
    from ckptlab.torch import flash_attn_func, flash_attn_varlen_func

    tdtype = getattr(torch, dtype)
    for lengths, shape in (([(130, 20), (3, 7)], (256, 128)), ([(20, 130), (7, 3)], (128, 256))):
        q, k, v = packed(torch, lengths, 2, 16, tdtype, seed=2)
        cu_q = offsets(torch, [a for a, _ in lengths])
        cu_k = offsets(torch, [b for _, b in lengths])
        max_q, max_k = max(a for a, _ in lengths), max(b for _, b in lengths)
        with emu.settings(mode="fast"):
            torch.manual_seed(5)
            _, _, S = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, 0.2,
                                             return_attn_probs=True)
            assert S.shape == (len(lengths), 2, *shape) and S.dtype == tdtype
            torch.manual_seed(5)
            for i, (nq, nk) in enumerate(lengths):
                sq = slice(int(cu_q[i]), int(cu_q[i + 1]))
                sk = slice(int(cu_k[i]), int(cu_k[i + 1]))
                _, _, s = flash_attn_func(q[None, sq], k[None, sk], v[None, sk], 0.2,
                                          return_attn_probs=True)
                assert torch.equal(S[i, :, :nq, :nk], s[0, :, :nq, :nk]), (lengths, i)
                assert S[i, :, :nq, :nk].abs().sum() > 0
                assert not S[i, :, nq:].any() and not S[i, :, :, nk:].any()
