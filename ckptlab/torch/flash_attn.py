"""FlashAttention 2's Python interface over ckptlab's flash kernels, for code (and test suites)
written against `flash_attn`.

    from ckptlab.torch.flash_attn import flash_attn_func
    out = flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False)
    out, softmax_lse, S_dmask = flash_attn_func(q, k, v, 0.1, return_attn_probs=True)
    out = flash_attn_qkvpacked_func(qkv, ...)       # qkv (batch, seqlen, 3, nheads, headdim)
    out = flash_attn_kvpacked_func(q, kv, ...)      # kv (batch, seqlen_k, 2, nheads_k, headdim)

flash_attn 2.x's signatures, argument order and defaults, and its layout: q (batch, seqlen_q,
nheads, headdim), k and v (batch, seqlen_k, nheads_k, headdim), out like q. Underneath is
ckptlab.torch.attention(method="flash"), which takes (batch, nheads, seqlen, headdim): q, k and v
are copied into that layout (k and v expanded to nheads heads in the same copy; one more copy
where the head dim is padded) and out is copied back, copies FlashAttention does not make (its
kernels read the strided layout); their gradients go the same ways by autograd. What matches
flash_attn:

- MQA / GQA: nheads_k divides nheads, and query head h reads key/value head h // (nheads /
  nheads_k). k and v are expanded to nheads heads (a copy); autograd sums the gradients of each
  group back into its shared head.
- causal: aligned to the bottom-right corner when seqlen_q != seqlen_k (flash_attn >= 2.1); a
  query row that sees no key gets out = 0 and softmax_lse = +inf.
- softmax_scale: None is 1 / sqrt(headdim). A headdim that is not a multiple of 8 is padded
  with zeros to one, as flash_attn does (ckptlab's kernels take multiples of 8 up to 256).
- softmax_lse: (batch, nheads, seqlen_q) float32, the kernel's own L = logsumexp of
  softmax_scale * q k^T per row, not differentiable.
- S_dmask: (batch, nheads, round128(seqlen_q), round128(seqlen_k)) in q's dtype, the padding
  zero. Entry (i, j) of key block n is exp(s_ij - m_in), s = softmax_scale * q k^T and m_in
  the largest s of row i in key blocks n, n+1, ... (FlashAttention's running max: its kernel
  walks the key blocks from the last), 0 where causal masking hides j from i, and negated
  where dropout dropped it (before the 1 / (1 - dropout_p) scaling): what flash_attn's tests
  decode
  (convert_flash_attn_S_to_softmax, then `dropout_mask = S_dmask >= 0` and
  normalize_flash_attn_S on its absolute value, block size _get_block_size_n(device, headdim,
  dropout_p > 0, causal)).
- dropout_p (the scaling 1 / (1 - dropout_p) of what is kept), deterministic (ckptlab's
  atomic-free dQ kernel; its forward is deterministic anyway), argument order and defaults.

What differs, precisely:

- window_size other than (-1, -1), softcap != 0 and alibi_slopes raise NotImplementedError
  (ckptlab's kernels have no local window, softcapping or bias). flash_attn ignores a
  negative softcap; ckptlab refuses it too.
- float32 inputs are accepted (flash_attn takes only float16 / bfloat16), and inputs of any
  strides (they are copied); bfloat16 CUDA tensors are refused (ckptlab.torch.arrays).
- The dropout mask is ckptlab's Philox mask (ckptlab.rng), not flash_attn's: the same
  statistics, other bits. Its seed is drawn from torch's default CPU generator (one
  torch.randint per call with dropout_p > 0; ckptlab.torch.attention.draw_seed), flash_attn's
  from the CUDA generator; torch.manual_seed fixes both.
- S_dmask is not written by the kernel (the flash kernels never hold P in memory): it is
  recomputed here, in float32 PyTorch from the (padded, expanded) q and k, with the kernel's
  dropout mask regenerated from the same Philox words, then rounded to q's dtype. It costs
  batch * nheads * seqlen_q * seqlen_k memory: a testing aid, as in flash_attn.
- S_dmask is returned whatever dropout_p; flash_attn returns an empty tensor (shape (0,))
  when dropout_p == 0.
- The key block size of S_dmask's scaling follows flash_attn's rule for q's device: on a CPU
  tensor (the emulator), the rule of an sm80 / sm90 GPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ckptlab import rng
from ckptlab.reference import causal_visible
from ckptlab.torch import arrays
from ckptlab.torch.attention import attention_with_lse, draw_seed

MAX_HEADDIM = 256  # flash_attn's limit, and ckptlab's kernels' (multiples of 8 up to 256)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False):
    """Attention of q (batch, seqlen_q, nheads, headdim) over k, v (batch, seqlen_k,
    nheads_k, headdim), nheads_k dividing nheads (MQA / GQA). Returns out (batch, seqlen_q,
    nheads, headdim), or (out, softmax_lse, S_dmask) with return_attn_probs. See the
    module's docstring for the conventions and the differences from flash_attn."""
    _refuse_unsupported(window_size, softcap, alibi_slopes)
    _check_shapes(q, k, v)
    return _flash(q, k, v, dropout_p, softmax_scale, causal, deterministic, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False):
    """flash_attn_func on qkv (batch, seqlen, 3, nheads, headdim) = stack((q, k, v), dim=2);
    the gradient is qkv's, one tensor."""
    _refuse_unsupported(window_size, softcap, alibi_slopes)
    check_packed("qkv", qkv, 3, "(batch, seqlen, 3, nheads, headdim)")
    q, k, v = qkv.unbind(dim=2)
    return _flash(q, k, v, dropout_p, softmax_scale, causal, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False):
    """flash_attn_func on q and kv (batch, seqlen_k, 2, nheads_k, headdim) = stack((k, v),
    dim=2); MQA / GQA as there."""
    _refuse_unsupported(window_size, softcap, alibi_slopes)
    check_packed("kv", kv, 2, "(batch, seqlen_k, 2, nheads_k, headdim)")
    k, v = kv.unbind(dim=2)
    _check_shapes(q, k, v)
    return _flash(q, k, v, dropout_p, softmax_scale, causal, deterministic, return_attn_probs)


# ---- checks -------------------------------------------------------------------------------
def _refuse_unsupported(window_size, softcap, alibi_slopes) -> None:
    try:
        window = tuple(int(w) for w in window_size)
    except (TypeError, ValueError):
        raise TypeError(f"window_size must be a pair of ints, got {window_size!r}") from None
    if window != (-1, -1):
        raise NotImplementedError(f"window_size={window}: sliding-window (local) attention is "
                                  "not implemented by ckptlab's kernels; pass window_size=(-1, "
                                  "-1) (full, or causal with causal=True)")
    if softcap != 0:
        raise NotImplementedError(f"softcap={softcap!r}: softcapping is not implemented by "
                                  "ckptlab's kernels; pass softcap=0.0")
    if alibi_slopes is not None:
        raise NotImplementedError("alibi_slopes: ALiBi biases are not implemented by ckptlab's "
                                  "kernels; pass alibi_slopes=None")


def check_rank(name, t, rank: int, layout: str) -> None:
    """t must be a dense torch.Tensor of `rank` dimensions; the error names the layout."""
    arrays.check_dense(name, t)
    if t.dim() != rank:
        raise ValueError(f"{name} must have shape {layout} (rank {rank}), got {tuple(t.shape)}")


def check_packed(name, t, n: int, layout: str, axis: int = 2) -> None:
    """A packed tensor: `n` tensors stacked on `axis` (qkv: 3, kv: 2), one rank above them."""
    check_rank(name, t, axis + 3, layout)
    if t.shape[axis] != n:
        raise ValueError(f"{name} must have shape {layout}, got {tuple(t.shape)}")


def _check_shapes(q, k, v) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_rank(name, t, 4, "(batch, seqlen, nheads, headdim)")
    if k.shape != v.shape:
        raise ValueError(f"v must have the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    B, _, H, d = q.shape
    if k.shape[0] != B or k.shape[3] != d:
        raise ValueError(f"k must have shape (batch, seqlen_k, nheads_k, headdim) = ({B}, "
                         f"seqlen_k, nheads_k, {d}) to match q {tuple(q.shape)}, got "
                         f"{tuple(k.shape)}")
    Hk = k.shape[2]
    if Hk < 1 or H % Hk:
        raise ValueError(f"the number of key/value heads ({Hk}) must divide the number of query "
                         f"heads ({H})")
    if not 1 <= d <= MAX_HEADDIM:
        raise ValueError(f"headdim must be in [1, {MAX_HEADDIM}], got {d}")


# ---- the computation ----------------------------------------------------------------------
def _heads_first(x, group: int, pad: int):
    """(B, N, h, d) -> (B, h * group, N, d + pad), C-contiguous: each head repeated `group`
    times in a row (head j serves query heads j*group ... j*group + group-1), the head dim
    padded with zeros. One copy (two when padding); autograd routes the gradient back."""
    if pad:
        x = F.pad(x, (0, pad))
    x = x.transpose(1, 2)  # (B, h, N, d'), a view
    if group > 1:
        B, h, N, dp = x.shape
        x = x[:, :, None].expand(B, h, group, N, dp).reshape(B, h * group, N, dp)
    return x.contiguous()  # reshape keeps a view (stride 0) where h == 1


def _flash(q, k, v, dropout_p, softmax_scale, causal, deterministic, return_attn_probs):
    B, Nq, H, d = q.shape
    Hk = k.shape[2]
    pad = -d % 8
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    seed = draw_seed(dropout_p)
    qh = _heads_first(q, 1, pad)
    kh, vh = (_heads_first(t, H // Hk, pad) for t in (k, v))
    O, lse = attention_with_lse(qh, kh, vh, causal=causal, dropout_p=dropout_p, scale=scale,
                                method="flash", deterministic=deterministic, seed=seed)
    out = O[..., :d].transpose(1, 2).contiguous()  # (B, Nq, H, d)
    if not return_attn_probs:
        return out
    S_dmask = _s_dmask(qh, kh, scale, causal, dropout_p, seed, d)
    return out, lse, S_dmask


def round_multiple(n: int, m: int) -> int:
    return -(-n // m) * m


def block_size_n(headdim: int, is_dropout: bool, is_causal: bool, device) -> int:
    """The key block size FlashAttention 2's forward kernel runs with (flash_attn's tests call
    it _get_block_size_n): S_dmask's scaling changes from block to block."""
    if headdim <= 32:
        return 128
    if headdim <= 64:
        return 64 if is_dropout else 128
    if headdim <= 96:
        return 64
    if headdim <= 128:
        major, minor = (torch.cuda.get_device_capability(device)
                        if torch.device(device).type == "cuda" else (8, 0))
        if major == 8 and minor > 0:  # sm86, sm89 (not sm80)
            return 64 if is_causal and not is_dropout else 32
        return 32 if is_dropout else 64
    return 64


def _s_dmask(qh, kh, scale, causal, dropout_p, seed, d):
    """flash_attn's S_dmask from (B, H, N, d') q and k (see the module's docstring)."""
    B, H, Nq, _ = qh.shape
    Nk = kh.shape[2]
    with torch.no_grad():
        S = scale * (qh.float() @ kh.float().transpose(-1, -2))  # (B, H, Nq, Nk) fp32
        if causal:
            visible = torch.from_numpy(causal_visible(Nq, Nk)).to(S.device)
            S.masked_fill_(~visible, float("-inf"))
        n = block_size_n(d, dropout_p > 0, causal, qh.device)
        block_max = torch.stack([s.amax(-1) for s in S.split(n, dim=-1)], dim=-1)
        m = torch.cummax(block_max.flip(-1), dim=-1).values.flip(-1)  # max over blocks n, n+1..
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # no visible key: exp(-inf)
        A = torch.exp(S - m.repeat_interleave(n, dim=-1)[..., :Nk])
        if dropout_p > 0:
            keep = torch.from_numpy(rng.keep_mask(seed, 0, (B, H, Nq, Nk), dropout_p))
            A = torch.where(keep.to(A.device), A, -A)
        A = A.to(qh.dtype)
        return F.pad(A, (0, round_multiple(Nk, 128) - Nk, 0, round_multiple(Nq, 128) - Nq))
