"""ckptlab's attention kernels as a torch.autograd.Function.

    O = attention(q, k, v, causal=False, dropout_p=0.0, scale=None, method="flash",
                  deterministic=False, seed=None, offset=0)

q, k, v are torch tensors (B, H, N, d), C-contiguous, all on one device, in fp32 (every method)
or float16 / bfloat16 (stored and flash: the tensor-core kernels, fp32 L and S; bfloat16 on CPU
tensors only until a GPU has run it): CPU tensors run
on the emulator through zero-copy NumPy views, CUDA tensors on the GPU through CuPy and DLPack
on torch's current stream (arrays.py). The forward launches `kernels.<method>_forward` and
saves, through ctx.save_for_backward (so torch.autograd.graph.saved_tensors_hooks see them),
the inputs q, k, v and exactly the kernel's Saved.tensors: P for naive; O and L = m + log l for
flash, O being the output tensor itself. The backward launches `kernels.<method>_backward`.

Dropout follows ckptlab's Philox convention: element (b, h, i, j) keeps its value iff Philox
word ((b*H + h)*Nq + i)*Nk + j of (seed, offset) clears the threshold (ckptlab.rng). Pass seed
(and offset) to fix the mask; with seed=None and dropout_p > 0 the seed is drawn from torch's
default CPU generator (one torch.randint per call, offset 0), so torch.manual_seed reproduces a
run and torch.utils.checkpoint, which restores that generator before a recompute, redraws the
same mask. With dropout_p = 0 nothing is drawn.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect

import torch
from torch.autograd.function import once_differentiable

from ckptlab import kernels
from ckptlab.torch import arrays

# the methods whose launch wrappers this ckptlab has, in the order of the controlled experiment
METHODS = tuple(m for m in ("naive", "stored", "flash") if hasattr(kernels, f"{m}_forward"))

_counters: list = []  # FLOP tallies open in flop_counter()


@contextlib.contextmanager
def flop_counter():
    """Count attention FLOPs as the engine does: {"forward": 4 B H Nq Nk d per call,
    "backward": 8 B H Nq Nk d, "recompute": 2 B H Nq Nk d for flash (S = Q K^T again)}."""
    tally = {"forward": 0, "backward": 0, "recompute": 0}
    _counters.append(tally)
    try:
        yield tally
    finally:
        _counters.remove(tally)


def _count(phase: str, n: int) -> None:
    for tally in _counters:
        tally[phase] += n


@dataclasses.dataclass(frozen=True)
class _Options:
    causal: bool
    scale: float | None
    dropout_p: float
    seed: int
    offset: int
    method: str
    deterministic: bool


class _Attention(torch.autograd.Function):
    """forward: kernels.<method>_forward; backward: kernels.<method>_backward."""

    @staticmethod
    def forward(ctx, q, k, v, opts: _Options):
        launch = getattr(kernels, f"{opts.method}_forward")
        with arrays.on(q) as (to_array, to_tensor):
            O, saved = launch(to_array(q), to_array(k), to_array(v), causal=opts.causal,
                              scale=opts.scale, dropout_p=opts.dropout_p, seed=opts.seed,
                              offset=opts.offset)
            out = to_tensor(O)  # (B, H, Nq, d)
            held = {name: out if a is O else to_tensor(a) for name, a in saved.tensors.items()}
        ctx.meta = dataclasses.replace(saved, tensors={})  # options and shapes, no arrays
        ctx.names, ctx.deterministic = tuple(held), opts.deterministic
        ctx.save_for_backward(q, k, v, *held.values())
        _count("forward", 2 * _matmul_flops(saved.shapes))
        return out

    @staticmethod
    @once_differentiable  # the kernels' gradients are not themselves differentiable
    def backward(ctx, dO):
        q, k, v, *held = ctx.saved_tensors
        method = ctx.meta.method
        launch = getattr(kernels, f"{method}_backward")
        kw = ({"deterministic": ctx.deterministic}
              if "deterministic" in inspect.signature(launch).parameters else {})
        with arrays.on(q) as (to_array, to_tensor):
            saved = dataclasses.replace(
                ctx.meta, tensors={n: to_array(t) for n, t in zip(ctx.names, held, strict=True)})
            grads = launch(to_array(dO.contiguous()), to_array(q), to_array(k), to_array(v),
                           saved, **kw)
            dq, dk, dv = (to_tensor(g) for g in grads)
        mm = _matmul_flops(ctx.meta.shapes)
        _count("backward", 4 * mm)
        if method == "flash":
            _count("recompute", mm)  # S = scale Q K^T, again, tile by tile
        return dq, dk, dv, None


def _matmul_flops(shapes) -> int:
    """FLOPs of one (Nq x d) @ (d x Nk) product per head: 2 B H Nq Nk d."""
    B, H, Nq, Nk, d = shapes
    return 2 * B * H * Nq * Nk * d


def attention(q, k, v, causal: bool = False, dropout_p: float = 0.0, scale: float | None = None,
              method: str = "flash", deterministic: bool = False, seed: int | None = None,
              offset: int = 0) -> torch.Tensor:
    """O = dropout(softmax(scale Q K^T)) V with ckptlab's kernels, differentiable in q, k, v.
    Causal masking is aligned to the bottom-right corner when Nq != Nk (FlashAttention 2.1+);
    a row that sees no key gets O = 0."""
    arrays.check_tensor("q", q)
    arrays.check_tensor("k", k, like=q)
    arrays.check_tensor("v", v, like=q)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool, got {deterministic!r}")
    if seed is None:
        drawn = isinstance(dropout_p, (int, float)) and dropout_p > 0
        seed = int(torch.randint(0, 2**62, ()).item()) if drawn else 0
    opts = _Options(causal, scale, dropout_p, seed, offset, method, deterministic)
    return _Attention.apply(q, k, v, opts)
