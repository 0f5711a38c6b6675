"""ckptlab.torch.bert_padding: unpad_input / pad_input as FlashAttention's varlen tests use
them (generate_qkv): a padded batch with random padding masks, unpadded, run through
flash_attn_varlen_func, padded back, equals flash_attn_func run on each row's real tokens
alone, bit for bit; padding positions are zero; gradients reach exactly the real tokens."""

import pytest
from torch_oracle import torch  # skips this module without PyTorch

from ckptlab import emu
from ckptlab.torch import flash_attn_func, flash_attn_varlen_func
from ckptlab.torch.bert_padding import pad_input, unpad_input


def random_mask(batch, seqlen, g):
    """flash_attn's right padding (lengths from seqlen // 3 to seqlen) plus one row with holes
    (kept tokens need not be contiguous)."""
    lengths = torch.randint(max(1, seqlen // 3), seqlen + 1, (batch,), generator=g)
    mask = torch.arange(seqlen)[None, :] < lengths[:, None]
    mask[0] = torch.rand(seqlen, generator=g) < 0.6
    mask[0, 0] = True
    return mask


def test_unpad_and_pad_are_inverse_and_count_as_flash_attn_does():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 10, 2, 4, generator=g, requires_grad=True)
    mask = random_mask(3, 10, g)
    unused = torch.zeros_like(mask)
    unused[1, -1] = not mask[1, -1]
    tokens, indices, cu, max_seqlen, seqused = unpad_input(x, mask, unused)
    kept = mask | unused
    assert tokens.shape == (int(kept.sum()), 2, 4)
    assert cu.dtype == torch.int32 and cu.tolist() == [0, *kept.sum(1).cumsum(0).tolist()]
    assert max_seqlen == int(kept.sum(1).max()) and seqused.tolist() == mask.sum(1).tolist()
    back = pad_input(tokens, indices, 3, 10)
    assert torch.equal(back, x * kept[..., None, None])
    back.sum().backward()
    assert torch.equal(x.grad, kept[..., None, None].expand_as(x).float())
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(batch, seqlen\)"):
        unpad_input(x, mask[:, :5])


@pytest.mark.parametrize("causal", [False, True])
def test_padded_batch_through_varlen_is_each_row_alone(causal):
    g = torch.Generator().manual_seed(1)
    B, Nq, Nk, H, Hk, d = 3, 21, 30, 4, 2, 32
    q = torch.randn(B, Nq, H, d, generator=g, dtype=torch.float16, requires_grad=True)
    k, v = (torch.randn(B, Nk, Hk, d, generator=g, dtype=torch.float16, requires_grad=True)
            for _ in range(2))
    mq, mk = random_mask(B, Nq, g), random_mask(B, Nk, g)
    q_un, iq, cu_q, max_q, _ = unpad_input(q, mq)
    k_un, ik, cu_k, max_k, _ = unpad_input(k, mk)
    v_un, *_ = unpad_input(v, mk)
    with emu.settings(mode="fast"):
        out = pad_input(flash_attn_varlen_func(q_un, k_un, v_un, cu_q, cu_k, max_q, max_k,
                                               causal=causal), iq, B, Nq)
        dout = torch.randn(out.shape, generator=g, dtype=torch.float16)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        assert not out[~mq].any()
        for b in range(B):
            leaves = [t.detach()[b][m].clone().requires_grad_(True)
                      for t, m in ((q, mq[b]), (k, mk[b]), (v, mk[b]))]
            want = flash_attn_func(*(t[None] for t in leaves), causal=causal)[0]
            assert torch.equal(out[b][mq[b]], want), b
            want.backward(dout[b][mq[b]])
            for got, leaf, m in zip(grads, leaves, (mq[b], mk[b], mk[b]), strict=True):
                assert torch.equal(got[b][m], leaf.grad) and not got[b][~m].any(), b
