"""The launches behind ckptlab's attention in PyTorch, with an autograd ctx or without one:
what the autograd.Function classes (attention.py) and the custom operators torch.compile
records (compiled.py) both run, so the two paths give the same bits.

    out = _forward(ctx, q, k, v, _Options(...))   # launches kernels.<method>_forward; keeps
                                                  # the Saved set on ctx (save_for_backward)
    dq, dk, dv = _backward(ctx, dO)               # kernels.<method>_backward on it
    with flop_counter() as tally: ...             # FLOPs, as the engine counts them
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect

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
    with_lse: bool = False  # also return L (B, H, Nq), non-differentiable (fused methods)


def _one_head(t):
    """(B, N, d) -> (B, 1, N, d), a view; a 4-D tensor as it is."""
    return t.unsqueeze(1) if t.dim() == 3 else t


def _caller_rank(a, one_head: bool):
    """A kernel array (B, 1, ...) as (B, ...) for a one-head call: a view (the arrays are
    C-contiguous); anything else as it is."""
    return a.reshape(a.shape[:1] + a.shape[2:]) if one_head and a.ndim >= 2 else a


def _forward(ctx, q, k, v, opts: _Options):
    """The forward every Function here runs: launch, keep the Saved set on ctx (viewed to the
    caller's rank), count FLOPs. Returns O, and L too when opts.with_lse."""
    launch = getattr(kernels, f"{opts.method}_forward")
    one = q.dim() == 3
    with arrays.on(q) as (to_array, to_tensor):
        O, saved = launch(*(to_array(_one_head(t)) for t in (q, k, v)), causal=opts.causal,
                          scale=opts.scale, dropout_p=opts.dropout_p, seed=opts.seed,
                          offset=opts.offset)
        out = to_tensor(_caller_rank(O, one))  # (B, H, Nq, d), or (B, Nq, d) for one head
        held = {name: out if a is O else to_tensor(_caller_rank(a, one))
                for name, a in saved.tensors.items()}
    ctx.meta = dataclasses.replace(saved, tensors={})  # options and shapes, no arrays
    ctx.names, ctx.deterministic = tuple(held), opts.deterministic
    ctx.kernel_shapes = tuple(tuple(a.shape) for a in saved.tensors.values())
    ctx.save_for_backward(q, k, v, *held.values())
    _count("forward", 2 * _matmul_flops(saved.shapes))
    if not opts.with_lse:
        return out
    ctx.mark_non_differentiable(held["L"])  # _attention refused naive, which keeps no L
    return out, held["L"]


def _backward(ctx, dO):
    """The backward every Function here runs: (dq, dk, dv) in the inputs' shapes."""
    q, k, v, *held = ctx.saved_tensors
    method = ctx.meta.method
    launch = getattr(kernels, f"{method}_backward")
    kw = ({"deterministic": ctx.deterministic}
          if "deterministic" in inspect.signature(launch).parameters else {})
    with arrays.on(q) as (to_array, to_tensor):
        tensors = {n: to_array(t).reshape(shape)  # back to the kernels' (B, H, ...): a view
                   for n, t, shape in zip(ctx.names, held, ctx.kernel_shapes, strict=True)}
        saved = dataclasses.replace(ctx.meta, tensors=tensors)
        grads = launch(to_array(_one_head(dO.contiguous())),
                       *(to_array(_one_head(t)) for t in (q, k, v)), saved, **kw)
        dq, dk, dv = (to_tensor(g.reshape(t.shape)) for g, t in zip(grads, (q, k, v),
                                                                    strict=True))
    mm = _matmul_flops(ctx.meta.shapes)
    _count("backward", 4 * mm)
    if method == "flash":
        _count("recompute", mm)  # S = scale Q K^T, again, tile by tile
    return dq, dk, dv


def _matmul_flops(shapes) -> int:
    """FLOPs of one (Nq x d) @ (d x Nk) product per head: 2 B H Nq Nk d."""
    B, H, Nq, Nk, d = shapes
    return 2 * B * H * Nq * Nk * d
