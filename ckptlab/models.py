"""A small model zoo for the labs and benchmarks, written as chains of stages so that any
schedule (ckptlab.recompute.schedules) can be applied to the blocks in the middle.

    MLP:  x (B, D) -> L x [x + dropout(relu(x W1 + b1) W2 + b2)] -> cross-entropy(x Wo + bo)
    GPT:  tokens (B, N) -> wte[t] + wpe[n] -> dropout ->
          L x [x + dropout(attn(layernorm(x)) Wo), x + dropout(gelu(layernorm(x) Wfc) Wproj)]
          -> layernorm -> x W_head -> cross-entropy

Linear weights are (in, out): y = x @ W + b. `stages(targets)` is the chain [prefix..., blocks,
head]; `first` is the index of block 0 in it. `torch_stages` builds the same chain in PyTorch on
the same weights, with the same dropout masks, as an independent oracle and a benchmark twin.
"""

from __future__ import annotations

import math

import numpy as np

from ckptlab import rng
from ckptlab.engine import layers, ops, tape
from ckptlab.engine.arrays import xp_of
from ckptlab.engine.tensor import Tensor
from ckptlab.recompute import profile, schedules
from ckptlab.recompute.checkpoint import checkpoint_sequential


class Chain:
    """What MLP and GPT share: parameters by name, the stage list, loss under a schedule."""

    first = 0  # stages before block 0

    def __init__(self, seed: int, dtype):
        self.params = {}
        self._rng = np.random.default_rng(seed)
        self.dtype = np.dtype(dtype)

    def _param(self, name: str, *shape, std: float = 1.0, mean: float = 0.0) -> Tensor:
        data = mean + std * self._rng.standard_normal(shape)
        self.params[name] = Tensor(data.astype(self.dtype), requires_grad=True)
        return self.params[name]

    def stages(self, targets) -> list:
        return [*self.prefix(), *self.blocks, lambda x: self.head(x, targets)]

    def prefix(self) -> list:
        return []

    def loss(self, inputs, targets, schedule=None, **kwargs) -> Tensor:
        """Forward through prefix, blocks (as `schedule` says: a Schedule, a plan or a spec
        such as "sqrt") and head; kwargs to checkpoint."""
        x = inputs if isinstance(inputs, Tensor) else Tensor(inputs)
        for stage in self.prefix():
            x = stage(x)
        if isinstance(schedule, str):
            schedule = schedules.make(schedule, len(self.blocks))
        with tape.recomputing(getattr(schedule, "recompute_ops", ())):  # e.g. recompute(attn)
            x = checkpoint_sequential(self.blocks, x, plan=schedule, **kwargs)
        return self.head(x, targets)

    def profile(self, inputs, targets, policies=(), recompute=()):
        """Measure each stage once (profile.profile) for the schedules' predictions; also
        under each selective `policies` and each set of ops in `recompute`."""
        x = inputs if isinstance(inputs, Tensor) else Tensor(inputs)
        return profile.profile(self.stages(targets), x, self.first, len(self.blocks), policies,
                               recompute)

    def zero_grad(self) -> None:
        for p in self.params.values():
            p.grad = None

    def grads(self) -> dict:
        return {k: p.grad for k, p in self.params.items()}


class MLP(Chain):
    """L residual MLP blocks of width D (hidden H = 4D by default) and a classifier head."""

    def __init__(self, width: int = 16, layers: int = 4, hidden: int | None = None,
                 classes: int = 8, dropout: float = 0.0, seed: int = 0, dtype=np.float64):
        super().__init__(seed, dtype)
        D, H = width, hidden or 4 * width
        self.width, self.layers, self.p = D, layers, dropout
        for i in range(layers):
            self._param(f"{i}.W1", D, H, std=1 / math.sqrt(D))
            self._param(f"{i}.b1", H, std=0.1)
            self._param(f"{i}.W2", H, D, std=1 / math.sqrt(H * layers))
            self._param(f"{i}.b2", D, std=0.1)
        self._param("Wo", D, classes, std=1 / math.sqrt(D))
        self._param("bo", classes, std=0.1)
        self.blocks = [self._block(i) for i in range(layers)]

    def _block(self, i: int):
        P = self.params

        def block(x: Tensor) -> Tensor:
            h = ops.relu(ops.linear(x, P[f"{i}.W1"], P[f"{i}.b1"]))  # (B, H)
            return x + layers.dropout(ops.linear(h, P[f"{i}.W2"], P[f"{i}.b2"]), self.p)  # (B, D)

        return block

    def head(self, x: Tensor, targets) -> Tensor:
        return layers.cross_entropy(ops.linear(x, self.params["Wo"], self.params["bo"]), targets)


class GPT(Chain):
    """A GPT-2-style transformer: token and position embeddings, L pre-norm blocks of causal
    self-attention (heads of width C/H) and a 4C MLP, a final layernorm and an untied head."""

    first = 1

    def __init__(self, vocab: int = 32, ctx: int = 8, width: int = 16, heads: int = 2,
                 layers: int = 2, dropout: float = 0.0, attn: str = "flash",
                 backend: str = "numpy", seed: int = 0, dtype=np.float64):
        super().__init__(seed, dtype)
        if width % heads:
            raise ValueError(f"width {width} must be divisible by heads {heads}")
        C = width
        self.vocab, self.ctx, self.width, self.heads, self.layers = vocab, ctx, C, heads, layers
        self.p, self.attn, self.backend = dropout, attn, backend
        self._param("wte", vocab, C, std=0.5)
        self._param("wpe", ctx, C, std=0.5)
        for i in range(layers):
            for ln in ("ln1", "ln2"):
                self._param(f"{i}.{ln}.w", C, std=0.1, mean=1.0)
                self._param(f"{i}.{ln}.b", C, std=0.1)
            for name, fan_in, fan_out in (("q", C, C), ("k", C, C), ("v", C, C), ("o", C, C),
                                          ("fc", C, 4 * C), ("proj", 4 * C, C)):
                self._param(f"{i}.W{name}", fan_in, fan_out, std=1 / math.sqrt(fan_in))
                self._param(f"{i}.b{name}", fan_out, std=0.1)
        self._param("lnf.w", C, std=0.1, mean=1.0)
        self._param("lnf.b", C, std=0.1)
        self._param("W_head", C, vocab, std=1 / math.sqrt(C))
        self.blocks = [self._block(i) for i in range(layers)]

    def prefix(self) -> list:
        return [self.embed]

    def embed(self, tokens: Tensor) -> Tensor:
        B, N = tokens.shape
        if N > self.ctx:
            raise ValueError(f"GPT: sequence of {N} tokens is longer than ctx={self.ctx}")
        pos = xp_of(tokens.data).arange(N)
        x = layers.embedding(self.params["wte"], tokens) + layers.embedding(self.params["wpe"], pos)
        return layers.dropout(x, self.p)  # (B, N, C)

    def _block(self, i: int):
        P, H = self.params, self.heads

        def lin(x, name):
            return ops.linear(x, P[f"{i}.W{name}"], P[f"{i}.b{name}"])

        def block(x: Tensor) -> Tensor:
            h = layers.layernorm(x, P[f"{i}.ln1.w"], P[f"{i}.ln1.b"])  # (B, N, C)
            q, k, v = (ops.split_heads(lin(h, n), H) for n in "qkv")  # (B, H, N, d)
            a = layers.attention(q, k, v, causal=True, impl=self.attn, dropout_p=self.p,
                              backend=self.backend)  # (B, H, N, d)
            x = x + layers.dropout(lin(ops.merge_heads(a), "o"), self.p)
            h = layers.layernorm(x, P[f"{i}.ln2.w"], P[f"{i}.ln2.b"])
            return x + layers.dropout(lin(ops.gelu(lin(h, "fc")), "proj"), self.p)  # (B, N, C)

        return block

    def head(self, x: Tensor, targets) -> Tensor:
        P = self.params
        logits = ops.linear(layers.layernorm(x, P["lnf.w"], P["lnf.b"]), P["W_head"])  # (B, N, V)
        return layers.cross_entropy(logits, targets)


# ------------------------------------------------------------------------------ PyTorch twin


def torch_stages(model: Chain, targets, dtype=None):
    """The model's stage chain in PyTorch, on copies of the same weights: (stages, params).

    Dropout masks are the engine's: rng.keep_mask with the offsets the engine will draw from
    its current RNG state, fixed per call site so torch.utils.checkpoint recomputes them."""
    import torch
    import torch.nn.functional as F

    from ckptlab import device

    dtype = dtype or (torch.float64 if model.dtype == np.float64 else torch.float32)
    params = {k: torch.tensor(device.to_numpy(p.data), dtype=dtype, requires_grad=True)
              for k, p in model.params.items()}
    seed, offset = tape.rng_state()
    sites = iter(range(offset, offset + 10**9))
    p = model.p
    targets = torch.as_tensor(device.to_numpy(getattr(targets, "data", targets)))

    def drop(site):
        def f(x):
            if site is None:
                return x
            keep = torch.from_numpy(rng.keep_mask(seed, site, tuple(x.shape), p))
            return torch.where(keep, x * (1.0 / (1.0 - p)), torch.zeros((), dtype=x.dtype))
        return f

    def new_site():
        return next(sites) if p > 0 else None

    P = params
    if isinstance(model, MLP):
        def mlp_block(i, d):
            return lambda x: x + d(torch.relu(x @ P[f"{i}.W1"] + P[f"{i}.b1"]) @ P[f"{i}.W2"]
                                   + P[f"{i}.b2"])
        blocks = [mlp_block(i, drop(new_site())) for i in range(model.layers)]

        def head(x):
            return F.cross_entropy(x @ P["Wo"] + P["bo"], targets)

        return blocks + [head], params

    C, H = model.width, model.heads
    d_embed = drop(new_site())

    def embed(tokens):
        N = tokens.shape[1]
        return d_embed(P["wte"][torch.as_tensor(tokens)] + P["wpe"][:N])

    def gpt_block(i, d_attn, d_res1, d_res2):
        def lin(x, n):
            return x @ P[f"{i}.W{n}"] + P[f"{i}.b{n}"]

        def block(x):
            B, N, _ = x.shape
            h = F.layer_norm(x, (C,), P[f"{i}.ln1.w"], P[f"{i}.ln1.b"], eps=1e-5)
            q, k, v = (lin(h, n).reshape(B, N, H, C // H).transpose(1, 2) for n in "qkv")
            S = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(C // H))
            allowed = torch.ones(N, N, dtype=torch.bool).tril()
            A = d_attn(torch.softmax(S.masked_fill(~allowed, float("-inf")), dim=-1)) @ v
            x = x + d_res1(lin(A.transpose(1, 2).reshape(B, N, C), "o"))
            h = F.layer_norm(x, (C,), P[f"{i}.ln2.w"], P[f"{i}.ln2.b"], eps=1e-5)
            return x + d_res2(lin(F.gelu(lin(h, "fc"), approximate="tanh"), "proj"))

        return block

    blocks = [gpt_block(i, drop(new_site()), drop(new_site()), drop(new_site()))
              for i in range(model.layers)]

    def head(x):
        h = F.layer_norm(x, (C,), P["lnf.w"], P["lnf.b"], eps=1e-5)
        return F.cross_entropy((h @ P["W_head"]).reshape(-1, model.vocab), targets.reshape(-1))

    return [embed] + blocks + [head], params
