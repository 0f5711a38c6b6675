"""The attention kernels as PyTorch custom operators (torch.library), so that torch.compile
can take a model that calls them: TorchDynamo does not trace into an operator, it records one
call, and its fake implementation gives the output shapes without running a kernel.

    torch.ops.ckptlab.attention_fwd(q, k, v, causal, scale, dropout_p, seed_hi, seed_lo,
                                    offset_hi, offset_lo, method, deterministic)
                                    -> [O, *saved but O]   (deterministic: for the backward)
    torch.ops.ckptlab.attention_bwd(dO, q, k, v, saved, causal, scale, dropout_p, seed_hi,
                                    seed_lo, offset_hi, offset_lo, method, deterministic)
                                    -> [dq, dk, dv]

attention.py routes attention() and attention_with_lse() (and so flash_attn_func and the
varlen functions) here while torch.compile traces them (torch.compiler.is_compiling()); run
eagerly they keep the autograd.Function, whose saved tensors the ledger measures. Both run the
same launches (launch._forward / _backward), so compiled and eager outputs and gradients
are the same bits. Seeds and offsets are 64-bit unsigned, an operator's int is signed: each is
passed as two 32-bit halves.
"""

from __future__ import annotations

import types

import numpy as np
import torch

from ckptlab.torch.launch import _backward, _forward, _Options

SAVED = {"naive": ("P",), "stored": ("O", "L", "S"), "flash": ("O", "L")}


def split64(x: int) -> tuple[int, int]:
    return int(x) >> 32, int(x) & 0xFFFFFFFF


def join64(hi: int, lo: int) -> int:
    return (int(hi) << 32) | int(lo)


def _shapes(q, k) -> tuple:
    """(B, H, Nq, Nk, d) of the kernels, for (B, H, N, d) or one-head (B, N, d) inputs."""
    B, H = q.shape[0], (q.shape[1] if q.dim() == 4 else 1)
    return B, H, q.shape[-2], k.shape[-2], q.shape[-1]


def _held_shape(name: str, q, k) -> tuple:
    """A saved tensor's shape at the caller's rank (launch._caller_rank)."""
    B, H, Nq, Nk, d = _shapes(q, k)
    lead = (B, H) if q.dim() == 4 else (B,)
    return lead + {"O": (Nq, d), "L": (Nq,), "S": (Nq, Nk), "P": (Nq, Nk)}[name]


class _Ctx(types.SimpleNamespace):
    """What launch._forward / _backward use of an autograd ctx, outside autograd."""

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    def mark_non_differentiable(self, *tensors):
        pass


@torch.library.custom_op("ckptlab::attention_fwd", mutates_args=())
def attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  scale: float | None, dropout_p: float, seed_hi: int, seed_lo: int,
                  offset_hi: int, offset_lo: int, method: str,
                  deterministic: bool) -> list[torch.Tensor]:
    ctx = _Ctx()
    opts = _Options(causal, scale, dropout_p, join64(seed_hi, seed_lo),
                    join64(offset_hi, offset_lo), method, deterministic)
    out = _forward(ctx, q, k, v, opts)
    held = ctx.saved_tensors[3:]  # in SAVED[method]'s order; O there is out itself
    return [out, *(t for name, t in zip(ctx.names, held, strict=True) if name != "O")]


@attention_fwd.register_fake
def _(q, k, v, causal, scale, dropout_p, seed_hi, seed_lo, offset_hi, offset_lo, method,
      deterministic):
    return [q.new_empty(_held_shape("O", q, k))] + [
        q.new_empty(_held_shape(name, q, k), dtype=torch.float32)
        for name in SAVED[method] if name != "O"]


@torch.library.custom_op("ckptlab::attention_bwd", mutates_args=())
def attention_bwd(dO: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  saved: list[torch.Tensor], causal: bool, scale: float | None,
                  dropout_p: float, seed_hi: int, seed_lo: int, offset_hi: int,
                  offset_lo: int, method: str, deterministic: bool) -> list[torch.Tensor]:
    from ckptlab.kernels.common import Saved

    B, H, Nq, Nk, d = shapes = _shapes(q, k)
    names = SAVED[method]
    resolved = float(1.0 / np.sqrt(d)) if scale is None else float(scale)  # check_options'
    meta = Saved(method, {}, bool(causal), resolved, float(dropout_p),
                 join64(seed_hi, seed_lo), join64(offset_hi, offset_lo), shapes)
    kernel = {"O": (B, H, Nq, d), "L": (B, H, Nq), "S": (B, H, Nq, Nk), "P": (B, H, Nq, Nk)}
    ctx = _Ctx(saved_tensors=(q, k, v, *saved), meta=meta, names=names,
               deterministic=deterministic, kernel_shapes=tuple(kernel[n] for n in names))
    return list(_backward(ctx, dO))


@attention_bwd.register_fake
def _(dO, q, k, v, saved, causal, scale, dropout_p, seed_hi, seed_lo, offset_hi, offset_lo,
      method, deterministic):
    return [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)]


def _setup_context(ctx, inputs, output):
    q, k, v, *options = inputs
    ctx.options = options
    ctx.save_for_backward(q, k, v, *output)


def arguments(q, k, v, opts) -> tuple:
    """attention_fwd's arguments for attention._Options."""
    return (q, k, v, bool(opts.causal), opts.scale, float(opts.dropout_p), *split64(opts.seed),
            *split64(opts.offset), opts.method, bool(opts.deterministic))


def backward(saved_tensors, options, dO) -> list:
    """[dq, dk, dv] from what attention_fwd's call saved: q, k, v and its outputs."""
    q, k, v, out, *rest = saved_tensors
    *options, method, deterministic = options
    saved = [out if name == "O" else rest.pop(0) for name in SAVED[method]]
    dO = dO if dO is not None else torch.zeros_like(out)
    return attention_bwd(dO.contiguous(), q, k, v, saved, *options, method, deterministic)


def _attention_backward(ctx, grads):
    return *backward(ctx.saved_tensors, ctx.options, grads[0]), *([None] * len(ctx.options))


attention_fwd.register_autograd(_attention_backward, setup_context=_setup_context)


def attention(q, k, v, opts):
    """O (and L when opts.with_lse) through the custom operators: what attention._attention
    runs while torch.compile traces it."""
    outs = attention_fwd(*arguments(q, k, v, opts))
    return (outs[0], outs[1]) if opts.with_lse else outs[0]
