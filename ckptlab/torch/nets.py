"""A torch MLP and a small GPT, written as chains of modules so that any ckptlab schedule
applies to the blocks in the middle (the shapes of ckptlab.models, in torch.nn).

    MLP:  x (B, D) -> L x [x + dropout(relu(x W1 + b1) W2 + b2)] -> cross-entropy(x Wo + bo)
    GPT:  tokens (B, N) -> wte[t] + wpe[n] -> dropout ->
          L x [x + dropout(attn(ln(x)) Wo), x + dropout(gelu(ln(x) Wfc) Wproj)]
          -> ln -> x W_head -> cross-entropy

`attn` picks the attention: a ckptlab method ("naive", "flash", ...) through
ckptlab.torch.attention, "sdpa" (torch's scaled_dot_product_attention, its own choice of
backend) or "math" (SDPA forced onto its math backend, the reference path on the CPU).
`stages(targets)` is the chain [prefix..., blocks..., head]; `first` is block 0's index in it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from ckptlab.torch.attention import METHODS, attention
from ckptlab.torch.profile import profile
from ckptlab.torch.recomputing import recomputed, recomputing
from ckptlab.torch.schedule import make_schedule, run_plan

ATTENTION = (*METHODS, "sdpa", "math")


def attend(q, k, v, how: str, dropout_p: float = 0.0):
    """Causal attention on (B, H, N, d) tensors, by `how` (one of ATTENTION)."""
    if how in METHODS:
        return attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=True,
                         dropout_p=dropout_p, method=how)
    if how == "math":
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    if how == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    raise ValueError(f"attention: expected one of {ATTENTION}, got {how!r}")


class Chain(nn.Module):
    """What MLP and GPT share: the stage list and the loss under a schedule."""

    first = 0
    schedule = None  # the default of forward(): set it before wrapping the model in DDP

    def prefix(self) -> list:
        return []

    def stages(self, targets) -> list:
        return [*self.prefix(), *self.blocks, _WithTargets(self.head, targets)]

    def forward(self, inputs, targets, schedule=None, profile=None):
        """The loss, the blocks run as `schedule` says (a spec, a Schedule or a plan over the
        blocks; None: self.schedule, None there too: no checkpointing). A budgeted spec needs
        `profile` (self.profile)."""
        schedule = self.schedule if schedule is None else schedule
        x = inputs
        for stage in self.prefix():
            x = stage(x)
        n = len(self.blocks)
        sched = make_schedule(list(range(n)) if schedule is None else schedule, n, profile)
        with recomputing(sched.recompute_ops):  # recompute(attn): the attention core redone
            x = run_plan(self.blocks, sched.plan, x)
        return self.head(x, targets)

    def profile(self, inputs, targets, policies=(), recompute=()):
        """ckptlab.torch.profile of the chain [prefix, blocks, head] on these inputs; also
        under the selective `policies` and the sets of ops in `recompute`."""
        return profile(self.stages(targets), inputs, self.first, len(self.blocks), policies,
                       recompute)


class _WithTargets(nn.Module):
    """The head as a one-input stage: head(x, targets)."""

    def __init__(self, head, targets):
        super().__init__()
        self.head, self.targets = head, targets

    def forward(self, x):
        return self.head(x, self.targets)


class MLPBlock(nn.Module):
    def __init__(self, width: int, hidden: int, dropout: float):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, hidden), nn.Linear(hidden, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return x + self.drop(self.fc2(torch.relu(self.fc1(x))))  # (B, D)


class Classifier(nn.Module):
    def __init__(self, width: int, classes: int):
        super().__init__()
        self.out = nn.Linear(width, classes)

    def forward(self, x, targets):
        return F.cross_entropy(self.out(x), targets)


class MLP(Chain):
    """L residual MLP blocks of width D (hidden 4D) and a classifier head."""

    def __init__(self, width: int = 16, layers: int = 4, classes: int = 8,
                 dropout: float = 0.0, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.blocks = nn.ModuleList(MLPBlock(width, 4 * width, dropout) for _ in range(layers))
        self.head = Classifier(width, classes)


class Embed(nn.Module):
    def __init__(self, vocab: int, ctx: int, width: int, dropout: float):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(ctx, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, tokens):
        N = tokens.shape[1]
        if N > self.wpe.num_embeddings:
            raise ValueError(f"GPT: sequence of {N} tokens is longer than ctx="
                             f"{self.wpe.num_embeddings}")
        pos = torch.arange(N, device=tokens.device)
        return self.drop(self.wte(tokens) + self.wpe(pos))  # (B, N, C)


def check_shape(width: int, heads: int, attn: str) -> None:
    """A block the attention can run: heads divides width, and for ckptlab's kernels the head
    dim width / heads is one they take (a multiple of 8 up to 256: kernels.HEAD_DIMS)."""
    from ckptlab.kernels import HEAD_DIMS

    if attn not in ATTENTION:
        raise ValueError(f"attn: expected one of {ATTENTION}, got {attn!r}")
    if heads < 1 or width % heads:
        raise ValueError(f"width {width} must be divisible by heads {heads}")
    if attn in METHODS and width // heads not in HEAD_DIMS:
        raise ValueError(f"head dim width / heads = {width} / {heads} = {width // heads}: "
                         f"ckptlab's kernels take a multiple of 8 up to {HEAD_DIMS[-1]}")


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention (H heads of d = C/H), a 4C MLP."""

    def __init__(self, width: int, heads: int, dropout: float, attn: str):
        super().__init__()
        check_shape(width, heads, attn)
        self.heads, self.attn, self.p = heads, attn, dropout
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.fc, self.proj = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        B, N, C = x.shape
        H = self.heads
        h = self.ln1(x)
        q, k, v = (lin(h).view(B, N, H, C // H).transpose(1, 2) for lin in (self.q, self.k,
                                                                           self.v))  # (B,H,N,d)
        p = self.p if self.training else 0.0
        a = recomputed("attention", attend, q, k, v, self.attn, p)  # (B, H, N, d)
        x = x + self.drop(self.o(a.transpose(1, 2).reshape(B, N, C)))
        return x + self.drop(self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh")))


class LMHead(nn.Module):
    def __init__(self, width: int, vocab: int):
        super().__init__()
        self.ln, self.out = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(self, x, targets):
        logits = self.out(self.ln(x))  # (B, N, V)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class GPT(Chain):
    """A GPT-2-style transformer with `attn` attention (see ATTENTION)."""

    first = 1

    def __init__(self, vocab: int = 32, ctx: int = 16, width: int = 32, heads: int = 2,
                 layers: int = 2, dropout: float = 0.0, attn: str = "flash", seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = Embed(vocab, ctx, width, dropout)
        self.blocks = nn.ModuleList(Block(width, heads, dropout, attn) for _ in range(layers))
        self.head = LMHead(width, vocab)
        for name, p in self.named_parameters():  # GPT-2's scaled init of residual projections
            if name.endswith(("o.weight", "proj.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))

    def prefix(self) -> list:
        return [self.embed]
