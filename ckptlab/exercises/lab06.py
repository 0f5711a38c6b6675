"""Checkers of labs/06_dropout_and_determinism.ipynb, one function per exercise.

The expected values come from ckptlab itself (the traffic models, the roofline, the float64
reference), never typed in, so an exercise follows the kernels if they change.
"""

from __future__ import annotations

from ckptlab import rng
from ckptlab.exercises.verdict import Verdict, close, exact
from ckptlab.exercises.write import in_notebook as write_kernel  # noqa: F401 (the labs' kernel cells)
from ckptlab.measure import traffic


def mask_bytes(answer, B: int = 64, H: int = 16, N: int = 1024) -> Verdict:
    """Bytes a stored dropout mask of attention's P would take, kept as ckptlab's boolean keep
    mask (rng.keep_mask), for (B, H, N, N)."""
    per = rng.keep_mask(0, 0, (1,), 0.5).itemsize  # bytes per element of the mask it draws
    want = B * H * N * N * per
    return exact(answer, want, "the byte count", hints=[
        (want * traffic.BYTES, "a keep mask is bool (1 byte per element), not fp32"),
        (want / 8, "NumPy stores a bool in a byte, not a bit (a packed mask would be 1/8)"),
    ], hint="the mask has P's shape (B, H, N, N)")


def deterministic_flops_ratio(answer, B: int = 64, H: int = 16, N: int = 1024,
                              d: int = 64) -> Verdict:
    """Hardware FLOPs of the deterministic flash backward over those of the atomic one (not
    causal): what bitwise reproducibility costs in arithmetic."""
    det, atomic = (traffic.totals(traffic.flash_backward_traffic(
        B, H, N, N, d, deterministic=x))["flops"] for x in (True, False))
    return close(answer, det / atomic, "the ratio", 0.01, hints=[
        (1.0, "the deterministic dq kernel recomputes S and dP = dO V^T a second time"),
    ], hint="count the matmuls each backward runs per (i, j) pair, 2 d FLOPs each: which "
            "does the deterministic dq kernel run that the atomic backward does not?")

