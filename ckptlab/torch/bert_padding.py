"""Padding removed and put back, the helpers flash_attn.bert_padding offers and FlashAttention's
varlen tests call: a padded batch (batch, seqlen, ...) with an attention mask becomes the
packed tokens (total, ...) plus the cu_seqlens that flash_attn_varlen_func takes, and back.

    x_unpad, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, attention_mask)
    out = flash_attn_varlen_func(q_unpad, k_unpad, v_unpad, cu_seqlens_q, cu_seqlens_k, ...)
    out_padded = pad_input(out, indices, batch, seqlen)

Written here with flash_attn's signatures and return values (unpad_input returns five values,
as flash_attn >= 2.6; code written for the older four unpacks with `*rest`). Both are plain
torch indexing, differentiable by autograd (flash_attn uses custom autograd functions for the
same maths). A mask's kept tokens need not be contiguous: each row's kept tokens are packed
in order, which is what flash_attn does too.
"""

from __future__ import annotations

import numpy as np
import torch


def index_first_axis(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """x[indices] over the first axis (x (n, ...), indices (k,) int): (k, ...)."""
    return x[indices]


def index_put_first_axis(values: torch.Tensor, indices: torch.Tensor,
                         first_axis_dim: int) -> torch.Tensor:
    """A (first_axis_dim, ...) tensor of zeros with values (k, ...) put at rows indices."""
    out = values.new_zeros((first_axis_dim, *values.shape[1:]))
    return out.index_put((indices,), values)


def unpad_input(hidden_states: torch.Tensor, attention_mask: torch.Tensor,
                unused_mask: torch.Tensor | None = None):
    """hidden_states (batch, seqlen, ...), attention_mask (batch, seqlen) bool or 0/1, True
    where a token is real. Returns (tokens (total, ...), indices (total,) into the flattened
    batch * seqlen, cu_seqlens (batch + 1,) int32, max_seqlen_in_batch int, seqused (batch,)
    int32). unused_mask (flash_attn's): tokens allocated but not attended to; they are packed
    with the rest and counted in cu_seqlens but not in seqused."""
    for name, t in (("hidden_states", hidden_states), ("attention_mask", attention_mask),
                    ("unused_mask", unused_mask)):
        if not isinstance(t, torch.Tensor) and not (name == "unused_mask" and t is None):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__module__}."
                            f"{type(t).__name__}" + (" (torch.from_numpy(x) makes one)"
                                                     if isinstance(t, np.ndarray) else ""))
    if hidden_states.dim() < 2:
        raise ValueError(f"hidden_states must have shape (batch, seqlen, ...), rank >= 2, got "
                         f"{tuple(hidden_states.shape)}")
    if attention_mask.shape != hidden_states.shape[:2]:
        raise ValueError(f"attention_mask must have shape (batch, seqlen) = "
                         f"{tuple(hidden_states.shape[:2])}, got {tuple(attention_mask.shape)}")
    if unused_mask is not None and unused_mask.shape != attention_mask.shape:
        raise ValueError(f"unused_mask must have the shape of attention_mask "
                         f"{tuple(attention_mask.shape)}, got {tuple(unused_mask.shape)}")
    used = attention_mask.bool()
    kept = used | unused_mask.bool() if unused_mask is not None else used
    seqlens = kept.sum(dim=-1, dtype=torch.int32)
    seqused = used.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(kept.flatten(), as_tuple=False).flatten()
    cu_seqlens = torch.zeros(len(seqlens) + 1, dtype=torch.int32, device=seqlens.device)
    cu_seqlens[1:] = seqlens.cumsum(0, dtype=torch.int32)
    max_seqlen = int(seqlens.max()) if len(seqlens) else 0
    tokens = index_first_axis(hidden_states.reshape(-1, *hidden_states.shape[2:]), indices)
    return tokens, indices, cu_seqlens, max_seqlen, seqused


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int,
              seqlen: int) -> torch.Tensor:
    """The inverse of unpad_input: tokens (total, ...) back to (batch, seqlen, ...), zeros
    where a token was removed."""
    out = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])
