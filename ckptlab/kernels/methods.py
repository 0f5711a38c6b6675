"""The three attention methods by name, for code that compares them (the engine's attention op,
`python -m ckptlab check`, benchmarks): each differs from the next in one thing.

    naive   unfused: S and P through HBM, 16 x 16 matmul tiles (naive.py)
    stored  fused, the flash tiles; the forward writes S once, the backward reads it (stored.py)
    flash   fused, the same tiles; the backward recomputes S = Q K^T from Q, K and L (flash.py)

naive/stored is the gain of fusion and tiling, stored/flash the gain of recompute.
"""

from __future__ import annotations

from ckptlab.kernels.flash import flash_backward, flash_forward
from ckptlab.kernels.naive import naive_backward, naive_forward
from ckptlab.kernels.stored import stored_backward, stored_forward

METHODS = ("naive", "stored", "flash")
_FORWARD = {"naive": naive_forward, "stored": stored_forward, "flash": flash_forward}
_BACKWARD = {"naive": naive_backward, "stored": stored_backward, "flash": flash_backward}


def _method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return method


def forward(method: str, q, k, v, **options):
    """naive_forward, stored_forward or flash_forward by name; returns (O, saved)."""
    return _FORWARD[_method(method)](q, k, v, **options)


def backward(method: str, dO, q, k, v, saved, deterministic=False):
    """The backward of `method`; deterministic (atomic-free dQ) applies to stored and flash,
    the naive backward has no atomics."""
    if _method(method) == "naive":
        return naive_backward(dO, q, k, v, saved)
    return _BACKWARD[method](dO, q, k, v, saved, deterministic)


