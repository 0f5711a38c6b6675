"""FlashAttention 2's variable-length interface: sequences of different lengths packed along
one token axis, told apart by cumulative lengths (what flash_attn's varlen tests and most
training code with padding removed call).

    out = flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                 max_seqlen_k, dropout_p=0.0, causal=True)
    # q (total_q, nheads, headdim), k and v (total_k, nheads_k, headdim); sequence i is
    # q[cu_seqlens_q[i]:cu_seqlens_q[i + 1]] over k[cu_seqlens_k[i]:cu_seqlens_k[i + 1]]
    out = flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, ...)   # (total, 3, h, d)
    out = flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, ...)  # kv (t, 2, ..)

flash_attn 2.x's signatures, argument order, defaults and return shapes: out (total_q, nheads,
headdim); with return_attn_probs also softmax_lse (nheads, total_q) float32 and S_dmask
(batch, nheads, round128(max_seqlen_q), round128(max_seqlen_k)), sequence i's block in the
top-left corner of S_dmask[i] (the rest zero). Causal masking, MQA / GQA, softmax_scale,
dropout and S_dmask's conventions are flash_attn_func's (ckptlab.torch.flash_attn), applied to
each sequence on its own: causal aligns each sequence's own bottom-right corners, and a
sequence whose k is empty gives out = 0 and softmax_lse = +inf.

What differs: flash_attn runs one kernel over all sequences; here each sequence is one
flash_attn_func call (one forward and one backward launch pair per sequence, its own dropout
seed drawn from torch's generator), and out, softmax_lse and the gradients are joined by
torch.cat and slicing, so autograd routes each sequence's gradient to its rows. The numbers are
those of flash_attn_func on each sequence, bit for bit. block_table (paged KV cache) raises
NotImplementedError, as window_size, softcap and alibi_slopes do in flash_attn_func. flash_attn
trusts cu_seqlens and max_seqlen (a wrong one reads out of bounds or is silently wrong); here
they are checked before any launch: integer, 1-D, starting at 0, never decreasing, ending at
the number of tokens, with max_seqlen at least the longest sequence.
"""

from __future__ import annotations

import operator

import torch

from ckptlab.torch.flash_attn import (
    _check_shapes,
    _flash,
    _refuse_unsupported,
    check_packed,
    check_rank,
    round_multiple,
)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None):
    """Attention of each packed sequence of q (total_q, nheads, headdim) over its own keys and
    values in k, v (total_k, nheads_k, headdim). See the module's docstring."""
    _refuse_unsupported(window_size, softcap, alibi_slopes)
    if block_table is not None:
        raise NotImplementedError("block_table: a paged KV cache is not implemented by "
                                  "ckptlab's kernels; pass block_table=None")
    check_rank("q", q, 3, "(total_q, nheads, headdim)")
    check_rank("k", k, 3, "(total_k, nheads_k, headdim)")
    check_rank("v", v, 3, "(total_k, nheads_k, headdim)")
    _check_shapes(q[None], k[None], v[None])
    starts_q = _offsets("cu_seqlens_q", cu_seqlens_q, q.shape[0], "q")
    starts_k = _offsets("cu_seqlens_k", cu_seqlens_k, k.shape[0], "k")
    if len(starts_q) != len(starts_k):
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must hold batch_size + 1 offsets each, "
                         f"got {len(starts_q)} and {len(starts_k)}")
    lens_q = [b - a for a, b in zip(starts_q, starts_q[1:], strict=False)]
    lens_k = [b - a for a, b in zip(starts_k, starts_k[1:], strict=False)]
    max_q = _check_max("max_seqlen_q", max_seqlen_q, lens_q)
    max_k = _check_max("max_seqlen_k", max_seqlen_k, lens_k)

    batch, nheads = len(lens_q), q.shape[1]
    outs, lses, masks = [], [], []
    for i in range(batch):
        qi = q[starts_q[i]:starts_q[i + 1]]
        ki, vi = (t[starts_k[i]:starts_k[i + 1]] for t in (k, v))
        if lens_q[i] == 0 or lens_k[i] == 0:  # no rows, or rows that see no key: out = 0,
            outs.append(_NoKeys.apply(qi, ki, vi))  # joined to q, k, v: zero gradients
            lses.append(torch.full((nheads, lens_q[i]), float("inf"), dtype=torch.float32,
                                   device=q.device))  # softmax_lse = +inf
            masks.append(None)
        else:
            out, lse, S_dmask = _flash(qi[None], ki[None], vi[None], dropout_p, softmax_scale,
                                       causal, deterministic, True)
            outs.append(out[0])
            lses.append(lse[0])
            masks.append(S_dmask[0, :, :lens_q[i], :lens_k[i]])
    out = torch.cat(outs, dim=0)
    if not return_attn_probs:
        return out
    softmax_lse = torch.cat(lses, dim=1)
    S_dmask = torch.zeros(batch, nheads, round_multiple(max_q, 128), round_multiple(max_k, 128),
                          dtype=q.dtype, device=q.device)
    for i, m in enumerate(masks):
        if m is not None:
            S_dmask[i, :, :lens_q[i], :lens_k[i]] = m
    return out, softmax_lse, S_dmask


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """flash_attn_varlen_func on qkv (total, 3, nheads, headdim) = stack((q, k, v), dim=1), the
    same offsets for queries and keys; the gradient is qkv's, one tensor."""
    check_packed("qkv", qkv, 3, "(total, 3, nheads, headdim)", axis=1)
    q, k, v = qkv.unbind(dim=1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap,
                                  alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False):
    """flash_attn_varlen_func on q and kv (total_k, 2, nheads_k, headdim) = stack((k, v),
    dim=1)."""
    check_packed("kv", kv, 2, "(total_k, 2, nheads_k, headdim)", axis=1)
    k, v = kv.unbind(dim=1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                                  softcap, alibi_slopes, deterministic, return_attn_probs)


class _NoKeys(torch.autograd.Function):
    """out = 0 for a sequence whose q or k is empty, as flash_attn's kernel writes it, still
    joined to q, k and v: their gradients through it are zeros, so a batch where every key
    sequence is empty backpropagates (zeros) instead of having no graph."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.shapes = (q.shape, k.shape, v.shape)
        return torch.zeros_like(q)

    @staticmethod
    def backward(ctx, dout):
        return tuple(torch.zeros(shape, dtype=dout.dtype, device=dout.device) if need else None
                     for need, shape in zip(ctx.needs_input_grad, ctx.shapes, strict=True))


# ---- checks -------------------------------------------------------------------------------
def _offsets(name, cu, total: int, of: str) -> list[int]:
    """cu_seqlens as Python ints, checked: (batch_size + 1,) integers from 0 to `total`."""
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int32 offsets, got "
                        f"{type(cu).__module__}.{type(cu).__name__}")
    if cu.dtype.is_floating_point or cu.dtype.is_complex or cu.dtype == torch.bool:
        raise TypeError(f"{name} must hold integers (flash_attn's int32), got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"{name} must have shape (batch_size + 1,) with batch_size >= 1, got "
                         f"{tuple(cu.shape)}")
    offsets = [int(x) for x in cu.tolist()]
    if offsets[0] != 0:
        raise ValueError(f"{name} must start at 0, got {offsets[0]}")
    if any(b < a for a, b in zip(offsets, offsets[1:], strict=False)):
        raise ValueError(f"{name} must never decrease (they are cumulative lengths), got "
                         f"{offsets}")
    if offsets[-1] != total:
        raise ValueError(f"{name} must end at the number of tokens in {of} ({total}), got "
                         f"{offsets[-1]}")
    return offsets


def _check_max(name, value, lengths) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if value < max(lengths):
        raise ValueError(f"{name}={value} is less than the longest sequence ({max(lengths)}): "
                         "flash_attn would be silently wrong")
    return value
