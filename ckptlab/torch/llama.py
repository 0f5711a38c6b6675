"""A small Llama-family transformer in torch (CPU), the shape ckptlab.cluster.llama_layer
models: grouped-query attention with rotary positions, a SwiGLU MLP, RMSNorm, no biases,
untied input and output embeddings.

    model = Llama(LlamaConfig(layers=2, width=32, heads=4, kv_heads=2, ffn=48, seq=9))
    loss = model(tokens, targets)
    saved_per_block(model, x)          # what each block saves, measured (TorchLedger)

    tokens -> embed -> L x [x + wo(attn(rope(wq n), rope(wk n), wv n)), n = rmsnorm(x);
                            x + w2(silu(w1 n) * w3 n), n = rmsnorm(x)] -> rmsnorm -> output -> CE

What autograd saves, by op (measured by ckptlab.torch.llama_bytes' tests, predicted by the
shape): RMSNorm here is one autograd function that saves its input and fp32 rstd, as the GPU
kernels do (apex's and Transformer Engine's fused RMSNorm); PyTorch's own F.rms_norm on the CPU
is composed of ops and saves the normalized input as well (s b h more a norm). RoPE is
x cos + rotate(x) sin with the cos and sin tables as buffers: a multiplication by a tensor that
needs no gradient saves only that tensor, so every layer saves the two tables (one storage for
all) and no activation. Attention: "sdpa", PyTorch's scaled_dot_product_attention with
enable_gqa (on the CPU its flash kernel keeps Q, K and V at their own head counts, O and the
logsumexp); "math", the standard attention written out with the query heads of a group against
their shared K and V, no copy of either: it keeps Q, K, V and the probabilities P.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

ATTENTION = ("sdpa", "math")


@dataclass(frozen=True)
class LlamaConfig:
    layers: int = 2
    width: int = 32
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 48
    seq: int = 9
    vocab: int = 40
    attn: str = "sdpa"
    seed: int = 0

    def __post_init__(self):
        if self.attn not in ATTENTION:
            raise ValueError(f"attn: expected one of {ATTENTION}, got {self.attn!r}")
        if self.width % self.heads or self.heads % self.kv_heads or (self.width // self.heads) % 2:
            raise ValueError(f"width {self.width}, heads {self.heads}, kv_heads {self.kv_heads}:"
                             " heads must divide width (an even head dim), kv_heads heads")


class _RMSNormFn(torch.autograd.Function):
    """y = x rstd w, rstd = 1 / sqrt(mean(x^2) + eps); saves x and rstd (and w, a parameter)."""

    @staticmethod
    def forward(ctx, x, w, eps):
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd, w)
        return x * rstd * w

    @staticmethod
    def backward(ctx, dy):
        x, rstd, w = ctx.saved_tensors
        xhat = x * rstd
        g = dy * w
        dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        dw = (dy * xhat).reshape(-1, x.shape[-1]).sum(0)
        return dx, dw, None


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(width)), eps

    def forward(self, x):
        return _RMSNormFn.apply(x, self.weight, self.eps)


def rope_tables(seq: int, d: int, theta: float = 10000.0) -> tuple:
    """cos and sin of position x frequency, (seq, 1, d): RoPE's rotation of each pair (i, i +
    d/2) of a head's dims (the "rotate half" layout of Hugging Face's Llama)."""
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.outer(torch.arange(seq, dtype=torch.float64), inv)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().float()[:, None, :], ang.sin().float()[:, None, :]


def rope(x, cos, sin):
    """x (B, N, heads, d) rotated; saves nothing of x (module docstring)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def attend(q, k, v, how: str):
    """Causal attention of q (B, a, N, d) over k, v (B, g, N, d), each group of a / g query
    heads sharing one key/value head."""
    if how == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    B, a, N, d = q.shape
    g = k.shape[1]
    qg = q.reshape(B, g, a // g * N, d)  # a view: the group's heads one after another
    scores = (qg @ k.transpose(-1, -2)) * d ** -0.5  # (B, g, a/g N, N)
    mask = torch.ones(N, N, dtype=torch.bool, device=q.device).tril()
    bias = torch.zeros(N, N, device=q.device).masked_fill(~mask, float("-inf"))
    p = torch.softmax(scores + bias.repeat(a // g, 1), dim=-1)
    return (p @ v).reshape(B, a, N, d)


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        h, d = cfg.width, cfg.width // cfg.heads
        self.heads, self.kv_heads, self.d, self.attn = cfg.heads, cfg.kv_heads, d, cfg.attn
        self.attn_norm, self.ffn_norm = RMSNorm(h), RMSNorm(h)
        self.wq, self.wo = nn.Linear(h, h, bias=False), nn.Linear(h, h, bias=False)
        self.wk, self.wv = (nn.Linear(h, cfg.kv_heads * d, bias=False) for _ in range(2))
        self.w1, self.w3 = (nn.Linear(h, cfg.ffn, bias=False) for _ in range(2))
        self.w2 = nn.Linear(cfg.ffn, h, bias=False)

    def forward(self, x, cos, sin):
        B, N, h = x.shape
        n = self.attn_norm(x)
        q = rope(self.wq(n).view(B, N, self.heads, self.d), cos, sin)
        k = rope(self.wk(n).view(B, N, self.kv_heads, self.d), cos, sin)
        v = self.wv(n).view(B, N, self.kv_heads, self.d)
        if self.attn == "math":  # the grouped view of Q needs (B, a, N, d) in memory
            q = q.transpose(1, 2).contiguous()
        else:
            q = q.transpose(1, 2)
        o = attend(q, k.transpose(1, 2), v.transpose(1, 2), self.attn)
        x = x + self.wo(o.transpose(1, 2).reshape(B, N, h))
        n = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(n)) * self.w3(n))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.width)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.width)
        self.output = nn.Linear(cfg.width, cfg.vocab, bias=False)
        cos, sin = rope_tables(cfg.seq, cfg.width // cfg.heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def hidden(self, tokens, blocks=None):
        """The embedding and `blocks` (default all) on tokens (B, N)."""
        x = self.embed(tokens)
        for blk in self.blocks if blocks is None else blocks:
            x = blk(x, *self._rope(x))
        return x

    def _rope(self, x):
        N = x.shape[1]
        return self.cos[:N], self.sin[:N]

    def forward(self, tokens, targets):
        logits = self.output(self.norm(self.hidden(tokens)))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
