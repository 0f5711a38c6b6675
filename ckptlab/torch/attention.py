"""ckptlab's attention kernels as a torch.autograd.Function.

    O = attention(q, k, v, causal=False, dropout_p=0.0, scale=None, method="flash",
                  deterministic=False, seed=None, offset=0)
    O = FlashAttention.apply(q, k, v, is_causal)      # the same, as an autograd.Function

q, k, v are torch tensors (B, H, N, d), or (B, N, d) for one head, C-contiguous, all on one
device, in fp32 (every method) or float16 / bfloat16 (stored and flash: the tensor-core
kernels, fp32 L and S; bfloat16 on CPU tensors only until a GPU has run it): CPU tensors run on
the emulator through zero-copy NumPy views, CUDA tensors on the GPU through CuPy and DLPack on
torch's current stream (arrays.py). The forward launches `kernels.<method>_forward` and
saves, through ctx.save_for_backward (so torch.autograd.graph.saved_tensors_hooks see them),
the inputs q, k, v and exactly the kernel's Saved.tensors: P for naive; O and L = m + log l for
flash, O being the output tensor itself. The backward launches `kernels.<method>_backward`.

3-D inputs (B, N, d) are one head: the kernels run on (B, 1, N, d) views of them (no copy), O
comes back as (B, Nq, d), and every saved tensor is viewed back to the caller's rank: O
(B, Nq, d), L (B, Nq), P or S (B, Nq, Nk). So L is the one saved tensor of shape
(batch, n_queries), where Stanford CS336's FlashAttention tests look for it.

FlashAttention, StoredAttention and NaiveAttention are torch.autograd.Function classes with
CS336's call, `.apply(q, k, v, is_causal=False)`, which also takes the call of Triton's
fused-attention tutorial, `.apply(q, k, v, causal, sm_scale, warp_specialize)`: the method of
their name, the scale sm_scale (default 1/sqrt(d)), no dropout, the atomic dQ. They run the
same forward and backward as attention(), whose other options they lack. Causal masking is
aligned to the bottom-right corner, as everywhere in ckptlab: CS336's and Triton's references
align it to the top-left, the same mask when Nq == Nk.

Under torch.compile (any backend) the same launches run as torch.library custom operators
(compiled.py), which TorchDynamo records as one call each: compiled models give the eager
outputs and gradients, bit for bit, with no graph break.

Dropout follows ckptlab's Philox convention: element (b, h, i, j) keeps its value iff Philox
word ((b*H + h)*Nq + i)*Nk + j of (seed, offset) clears the threshold (ckptlab.rng). Pass seed
(and offset) to fix the mask; with seed=None and dropout_p > 0 the seed is drawn from torch's
default CPU generator (one torch.randint per call, offset 0), so torch.manual_seed reproduces a
run and torch.utils.checkpoint, which restores that generator before a recompute, redraws the
same mask. With dropout_p = 0 nothing is drawn.
"""

from __future__ import annotations

import functools

import torch
from torch._C import _functions

from ckptlab.torch import arrays, compiled
from ckptlab.torch.launch import (  # noqa: F401  (METHODS and flop_counter: the API's)
    METHODS,
    _backward,
    _forward,
    _Options,
    flop_counter,
)

TWICE = ("ckptlab's attention backward is not differentiable (it is @once_differentiable: the "
         "kernels' gradients are computed, not traced): double backward, a gradient of "
         "gradients taken with create_graph=True, is not supported")


def once_differentiable(backward):
    """torch.autograd.function.once_differentiable, but the error is attached whenever the
    graph of the gradients is built (create_graph=True), not only when dO requires grad: dO
    of out.sum() does not, and a second backward then met PyTorch's generic "does not require
    grad" instead of this reason."""
    @functools.wraps(backward)
    def wrapper(ctx, *args):
        with torch.no_grad():
            grads = backward(ctx, *args)
        if not torch.is_grad_enabled():
            return grads
        err = _functions.DelayedError(TWICE.encode(), len(grads))

        def alias(g):  # a detached alias that requires grad, so err_fn becomes its grad_fn
            return g if g is None else g.detach().requires_grad_(True)

        return err(*[alias(g) for g in grads])
    return wrapper


class _Attention(torch.autograd.Function):
    """forward: kernels.<method>_forward; backward: kernels.<method>_backward."""

    @staticmethod
    def forward(ctx, q, k, v, opts: _Options):
        return _forward(ctx, q, k, v, opts)

    @staticmethod
    @once_differentiable  # the kernels' gradients are not themselves differentiable
    def backward(ctx, dO, *dL):  # dL: L's gradient when with_lse (non-differentiable: unused)
        return *_backward(ctx, dO), None


class _Apply(torch.autograd.Function):
    """The autograd.Function calls of CS336, .apply(q, k, v, is_causal=False), and of Triton's
    fused-attention tutorial, .apply(q, k, v, causal, sm_scale, warp_specialize); each
    subclass names its method."""

    @staticmethod
    def run(ctx, q, k, v, is_causal, sm_scale, warp_specialize, method):
        _check(q, k, v, method, False)
        if not isinstance(warp_specialize, bool | None):
            raise TypeError(f"warp_specialize must be a bool, got {warp_specialize!r}")
        opts = _Options(is_causal, sm_scale, 0.0, 0, 0, method, False)
        if torch.compiler.is_compiling():  # torch.compile traces forward and backward: the
            _check_options(q, opts)  # custom operators, opaque to it (compiled.py)
            outs = compiled.attention_fwd(*compiled.arguments(q, k, v, opts))
            ctx.save_for_backward(q, k, v, *outs)
            ctx.compiled = compiled.arguments(q, k, v, opts)[3:]
            return outs[0]
        return _forward(ctx, q, k, v, opts)

    @staticmethod
    @once_differentiable
    def backward(ctx, dO):  # None for is_causal, sm_scale, warp_specialize (extra Nones are
        if getattr(ctx, "compiled", None) is not None:  # dropped for arguments not passed)
            return *compiled.backward(ctx.saved_tensors, ctx.compiled, dO), None, None, None
        return *_backward(ctx, dO), None, None, None


class FlashAttention(_Apply):
    """O = FlashAttention.apply(q, k, v, is_causal=False, sm_scale=None, warp_specialize=None):
    method "flash" (saves O and L). sm_scale None is 1/sqrt(d); warp_specialize, a scheduling
    hint of Triton's tutorial kernel, changes nothing here."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, sm_scale=None, warp_specialize=None):
        return _Apply.run(ctx, q, k, v, is_causal, sm_scale, warp_specialize, "flash")


class StoredAttention(_Apply):
    """O = StoredAttention.apply(q, k, v, is_causal=False, sm_scale=None,
    warp_specialize=None): method "stored" (saves O, L, S)."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, sm_scale=None, warp_specialize=None):
        return _Apply.run(ctx, q, k, v, is_causal, sm_scale, warp_specialize, "stored")


class NaiveAttention(_Apply):
    """O = NaiveAttention.apply(q, k, v, is_causal=False, sm_scale=None,
    warp_specialize=None): method "naive" (saves P)."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, sm_scale=None, warp_specialize=None):
        return _Apply.run(ctx, q, k, v, is_causal, sm_scale, warp_specialize, "naive")


def _check(q, k, v, method, deterministic) -> None:
    arrays.check_tensor("q", q)
    arrays.check_tensor("k", k, like=q)
    arrays.check_tensor("v", v, like=q)
    if q.dim() not in (3, 4):
        raise ValueError(f"q must have rank 4 (B, H, N, d) or 3 (B, N, d: one head), got shape "
                         f"{tuple(q.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.dim() != q.dim():
            what = "(B, H, N, d)" if q.dim() == 4 else "(B, N, d)"
            raise ValueError(f"{name} must have rank {q.dim()} {what} like q, got shape "
                             f"{tuple(t.shape)}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool, got {deterministic!r}")


def draw_seed(dropout_p) -> int:
    """The dropout seed attention() uses when given none: one torch.randint from torch's
    default CPU generator when dropout_p > 0 (torch.manual_seed reproduces it, checkpoint's
    RNG restore redraws it); 0, drawing nothing, otherwise."""
    drawn = isinstance(dropout_p, (int, float)) and dropout_p > 0
    return int(torch.randint(0, 2**62, ()).item()) if drawn else 0


def attention(q, k, v, causal: bool = False, *, dropout_p: float = 0.0,
              scale: float | None = None, method: str = "flash", deterministic: bool = False,
              seed: int | None = None, offset: int = 0) -> torch.Tensor:
    """O = dropout(softmax(scale Q K^T)) V with ckptlab's kernels, differentiable in q, k, v.
    q, k, v: (B, H, N, d), or (B, N, d) for one head (O is then (B, Nq, d)). Everything after
    causal is keyword-only: a fifth positional value means scale in one API (Triton's
    tutorial) and dropout_p in another (SDPA), so none is guessed here.
    Causal masking is aligned to the bottom-right corner when Nq != Nk (FlashAttention 2.1+);
    a row that sees no key gets O = 0."""
    return _attention(q, k, v, causal, dropout_p, scale, method, deterministic, seed, offset)


def attention_with_lse(q, k, v, causal: bool = False, *, dropout_p: float = 0.0,
                       scale: float | None = None, method: str = "flash",
                       deterministic: bool = False, seed: int | None = None, offset: int = 0):
    """attention() that also returns L = logsumexp(scale Q K^T) per row, fp32, (B, H, Nq) (or
    (B, Nq) for one head), +inf for a row that sees no key: the very tensor the backward
    reads, not differentiable. Methods "stored" and "flash" (naive keeps no L)."""
    return _attention(q, k, v, causal, dropout_p, scale, method, deterministic, seed, offset,
                      with_lse=True)


def _attention(q, k, v, causal, dropout_p, scale, method, deterministic, seed, offset,
               with_lse=False):
    _check(q, k, v, method, deterministic)
    if with_lse and method == "naive":
        raise ValueError("method 'naive' keeps no L (logsumexp); use 'stored' or 'flash'")
    if seed is None:
        seed = draw_seed(dropout_p)
    opts = _Options(causal, scale, dropout_p, seed, offset, method, deterministic, with_lse)
    if torch.compiler.is_compiling():  # torch.compile: one opaque operator call (compiled.py)
        _check_options(q, opts)
        return compiled.attention(q, k, v, opts)
    return _Attention.apply(q, k, v, opts)


def _check_options(q, opts) -> None:
    """The types an operator's schema takes (bool, float or None, float, int): refused here
    with the launch wrappers' words, not the schema's. Values are checked by the wrappers
    when the operator runs (kernels.common.check_options). No NumPy here: TorchDynamo would
    trace it."""
    if not isinstance(opts.causal, bool):
        raise TypeError(f"causal must be a bool, got {opts.causal!r}")
    if opts.scale is not None and (isinstance(opts.scale, bool) or
                                   not isinstance(opts.scale, (int, float))):
        raise ValueError(f"scale must be a finite number or None, got {opts.scale!r}")
    if isinstance(opts.dropout_p, bool) or not isinstance(opts.dropout_p, (int, float)):
        raise ValueError(f"dropout_p must be in [0, 1), got {opts.dropout_p!r}")
    for name, x in (("seed", opts.seed), ("offset", opts.offset)):
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < 2**64:
            raise ValueError(f"{name} must be an int in [0, 2**64), got {x!r}")
