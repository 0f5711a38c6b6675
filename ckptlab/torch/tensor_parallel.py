"""A transformer block split over a tensor-parallel group (Megatron-LM, Shoeybi et al. 2019),
and what each rank saves for its backward against Korthikanti et al.'s formula.

The block is pre-norm, non-causal, with dropout on the attention probabilities and after each
residual branch; t ranks each own a/t heads and 4h/t MLP columns:

    x -> LN -> f -> [Q K V: column split] -> attention on a/t heads -> [out: row split] -> g
      -> + b_o -> dropout -> + x -> LN -> f -> [fc: column] -> GeLU -> [proj: row] -> g -> ...

f is the identity forward and an all-reduce of the gradient backward; g an all-reduce forward
and the identity backward (Megatron's conjugate pair). With t = 1 (no group) both are the
identity: the same code is the one-process reference. Dropout masks come from Philox
(ckptlab.rng) for the full tensor, each rank taking its heads' part: split and unsplit runs see
the same masks, and a recompute redraws them.

What a rank saves, counted by storage (ckptlab.torch.ledger), is Korthikanti's list for that t
(ckptlab.cluster.at_scale.layer_activation_bytes, at this block's bytes per value) plus one
thing their count leaves out: each LayerNorm's per-token mean and rstd (fp32), 2 x 2 x 4 s b
bytes per block (`layernorm_stats_bytes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from ckptlab import rng
from ckptlab.cluster import at_scale
from ckptlab.recompute.plan import Seg
from ckptlab.torch.ledger import TorchLedger
from ckptlab.torch.schedule import run_plan


class _CopyToGroup(torch.autograd.Function):
    """f: identity forward; backward all-reduces the gradient over the group."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g)
        return g


class _ReduceFromGroup(torch.autograd.Function):
    """g: all-reduce forward (the partial sums of a row-split matmul); identity backward."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


def full_weights(h: int, seed: int = 0, dtype=torch.float32) -> dict:
    """The unsplit block's parameters (y = x @ W.T + b, nn.Linear's layout), from `seed`."""
    g = torch.Generator().manual_seed(seed)

    def w(out, inp):
        return torch.randn(out, inp, generator=g, dtype=dtype) / math.sqrt(inp)

    def b(n, mean=0.0):
        return mean + 0.1 * torch.randn(n, generator=g, dtype=dtype)

    return {"ln1.w": b(h, 1.0), "ln1.b": b(h), "q.w": w(h, h), "q.b": b(h), "k.w": w(h, h),
            "k.b": b(h), "v.w": w(h, h), "v.b": b(h), "o.w": w(h, h), "o.b": b(h),
            "ln2.w": b(h, 1.0), "ln2.b": b(h), "fc.w": w(4 * h, h), "fc.b": b(4 * h),
            "proj.w": w(h, 4 * h), "proj.b": b(h)}


def shard(weights: dict, rank: int, t: int) -> dict:
    """Rank `rank`'s part of the weights: q, k, v, fc split by output rows (column parallel),
    o and proj by input columns (row parallel); LayerNorms and row-parallel biases whole."""
    out = {}
    for name, p in weights.items():
        layer, kind = name.split(".")
        if layer in ("q", "k", "v", "fc"):
            p = p.chunk(t, dim=0)[rank]
        elif layer in ("o", "proj") and kind == "w":
            p = p.chunk(t, dim=1)[rank]
        out[name] = p.clone().requires_grad_(True)
    return out


class Block:
    """The block on rank `rank` of t (t = 1: whole), with Philox dropout keyed by `seed`."""

    def __init__(self, weights: dict, heads: int, rank: int = 0, t: int = 1,
                 dropout: float = 0.1, seed: int = 0):
        if heads % t:
            raise ValueError(f"heads = {heads} must be divisible by t = {t}")
        self.p, self.heads, self.rank, self.t, self.seed = dropout, heads, rank, t, seed
        self.params = shard(weights, rank, t)

    def _f(self, x):
        return _CopyToGroup.apply(x) if self.t > 1 else x

    def _g(self, x):
        return _ReduceFromGroup.apply(x) if self.t > 1 else x

    def _dropout(self, x, site: int, full_shape, heads_axis=None):
        """x * keep / (1 - p), keep from Philox (seed, site) over the full tensor; a
        head-split tensor takes this rank's heads. Saves only the mask (1 byte/element)."""
        if self.p == 0:
            return x
        keep = rng.keep_mask(self.seed, site, full_shape, self.p)
        if heads_axis is not None:
            n = full_shape[heads_axis] // self.t
            keep = np.ascontiguousarray(keep[:, self.rank * n:(self.rank + 1) * n])
        keep = torch.from_numpy(keep)
        return torch.where(keep, x * (1.0 / (1.0 - self.p)), 0.0)

    def __call__(self, x):
        P, (B, N, C) = self.params, x.shape
        H, d = self.heads, C // self.heads
        h = self._f(F.layer_norm(x, (C,), P["ln1.w"], P["ln1.b"]))  # (B, N, C)
        q, k, v = (F.linear(h, P[f"{n}.w"], P[f"{n}.b"]).view(B, N, -1, d).transpose(1, 2)
                   .contiguous() for n in "qkv")  # (B, H/t, N, d)
        S = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d))  # (B, H/t, N, N)
        A = self._dropout(torch.softmax(S, dim=-1), 0, (B, H, N, N), heads_axis=1) @ v
        a = A.transpose(1, 2).reshape(B, N, -1)  # (B, N, C/t)
        y = self._g(F.linear(a, P["o.w"])) + P["o.b"]
        x = x + self._dropout(y, 1, (B, N, C))
        h = self._f(F.layer_norm(x, (C,), P["ln2.w"], P["ln2.b"]))
        y = self._g(F.linear(F.gelu(F.linear(h, P["fc.w"], P["fc.b"])), P["proj.w"]))
        return x + self._dropout(y + P["proj.b"], 2, (B, N, C))


def layernorm_stats_bytes(s: int, b: int, dtype_bytes: int = 4) -> int:
    """What torch's LayerNorm saves beyond Korthikanti's count: mean and rstd per token, for
    the block's two LayerNorms."""
    return 2 * 2 * dtype_bytes * s * b


# ------------------------------------------------------------------------------ measured


@dataclass
class Shape:
    """The block measured by `measure` (s tokens, micro-batch b, hidden h, a heads)."""

    s: int = 32
    b: int = 2
    h: int = 64
    a: int = 4
    dropout: float = 0.1
    seed: int = 0


RECOMPUTES = {"none": [0], "full": [Seg([0])]}  # plans over the one block


def measure(rank: int, t: int, shape: Shape) -> dict:
    """The block on rank `rank` of t, plain and checkpointed (full recompute, through
    ckptlab.torch.schedule.run_plan): per recompute choice the saved bytes held after the
    forward, the peak over forward and backward, the output and the gradients (this rank's
    shards)."""
    g = torch.Generator().manual_seed(shape.seed + 1)
    x0 = torch.randn(shape.b, shape.s, shape.h, generator=g)  # (b, s, h), the same everywhere
    dy = torch.randn(shape.b, shape.s, shape.h, generator=g)
    block = Block(full_weights(shape.h, shape.seed), shape.a, rank, t, shape.dropout,
                  shape.seed)
    out = {}
    for name, plan in RECOMPUTES.items():
        x = x0.clone().requires_grad_(True)
        for p in block.params.values():
            p.grad = None
        led = TorchLedger(block.params.values())
        with led:
            y = run_plan([block], plan, x)
            held = led.bytes
            y.backward(dy)
        out[name] = dict(held=held, peak=led.peak, y=y.detach(), dx=x.grad,
                         grads={k: p.grad for k, p in block.params.items()})
    return out


def predicted(shape: Shape, t: int, recompute: str) -> int:
    """Korthikanti's bytes for this block at fp32 (at_scale), plus LayerNorm's statistics for
    the recompute choices that keep them."""
    stats = layernorm_stats_bytes(shape.s, shape.b) if recompute != "full" else 0
    return at_scale.layer_activation_bytes(shape.s, shape.b, shape.h, shape.a, recompute, t,
                                           bytes_per_value=4) + stats


def rel(x, y) -> float:
    return float((x - y).norm() / y.norm())


def check(ranks: list, reference: dict, shape: Shape, tol: float = 1e-5) -> list:
    """What disagrees: bytes held off the formula, a checkpointed peak other than the plain
    block's bytes, outputs or gradients off the one-process reference (relative Frobenius
    error > tol, or NaN: the same fp32 sums, split over ranks, are added in another order:
    ~1e-7)."""
    bad, t = [], len(ranks)
    for rank, out in enumerate(ranks):
        for name, r in out.items():
            want = predicted(shape, t, name)
            if r["held"] != want:
                bad.append(f"rank {rank} {name}: held {r['held']} bytes, formula {want}")
            ref = reference[name]
            errs = {"y": rel(r["y"], ref["y"]), "dx": rel(r["dx"], ref["dx"])}
            full = {k: g.detach() for k, g in shard(ref["grads"], rank, t).items()}
            # k.b's true gradient is 0 (softmax ignores a per-row constant): its values are
            # rounding noise, so errors are taken against at least 1e-3 x the largest gradient
            floor = 1e-3 * max(float(g.norm()) for g in ref["grads"].values())
            errs.update({k: float((g - full[k]).norm()) / max(float(full[k].norm()), floor)
                         for k, g in r["grads"].items()})
            bad += [f"rank {rank} {name} {k}: error {e:.1e}" for k, e in errs.items()
                    if not e <= tol]  # a NaN error (a NaN output) is a failure
        if out["full"]["peak"] != out["none"]["held"]:
            bad.append(f"rank {rank}: checkpointed peak {out['full']['peak']} != plain block "
                       f"{out['none']['held']}")
    return bad


def report(ranks: list, reference: dict, shape: Shape) -> str:
    t = len(ranks)
    lines = [f"tensor-parallel block (Megatron column/row split), t = {t}: s={shape.s} "
             f"b={shape.b} h={shape.h} a={shape.a}, fp32, dropout {shape.dropout}",
             f"{'recompute':<10}{'rank':>5}{'held after forward':>20}{'Korthikanti':>13}"
             f"{'+ LN stats':>12}{'peak':>10}"]
    for rank, out in [("1 proc", reference)] + list(enumerate(ranks)):
        n = 1 if rank == "1 proc" else t
        for name, r in out.items():
            f = at_scale.layer_activation_bytes(shape.s, shape.b, shape.h, shape.a, name, n,
                                                bytes_per_value=4)
            lines.append(f"{name:<10}{rank:>5}{r['held']:>20,}{f:>13,}"
                         f"{predicted(shape, n, name) - f:>12,}{r['peak']:>10,}")
    bad = check(ranks, reference, shape)
    lines.append("bytes == formula, outputs and gradients == one process (rel. error <= 1e-5)"
                 if not bad else "MISMATCH: " + "; ".join(bad))
    return "\n".join(lines)
