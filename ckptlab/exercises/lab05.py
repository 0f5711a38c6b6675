"""Checkers of labs/05_recompute_backward.ipynb (naive, stored, flash: what the recompute saves
and costs), one per exercise.

The expected values come from ckptlab itself (the traffic models), never typed in, so an
exercise follows the kernels if they change.
"""

from __future__ import annotations

from ckptlab.exercises.verdict import Verdict, exact
from ckptlab.exercises.write import in_notebook as write_kernel  # noqa: F401 (the labs' kernel cells)
from ckptlab.measure import pair_counts, traffic


def _counted(method: str, B, H, N, d) -> int:
    return traffic.totals(traffic.launches(method, B, H, N, N, d))["bytes"]


def recompute_flops(answer, B: int, H: int, N: int, d: int) -> Verdict:
    """FLOPs the flash backward (atomic dQ, not causal) spends recomputing S = scale Q K^T, for
    q, k, v of shape (B, H, N, d); matmul FLOPs, 2 per multiply-add, on the N x N scores (the
    kernel runs whole tiles: when N is not a multiple of them it executes more, traffic's
    hardware count)."""
    want = 2 * B * H * pair_counts.visible_pairs(N, N, False) * d
    run = sum(kt.recompute_flops for kt in traffic.launches("flash", B, H, N, N, d))
    return exact(answer, want, "the FLOP count", hints=[
        (run, "that counts the padded tail tiles the kernel also runs; the question asks for "
              "the N x N scores"),
        (want / 2, "a multiply-add is 2 FLOPs"),
        (want / H, f"that is one head's count: the batch has B x H = {B * H} heads"),
        (2 * want, "only S = Q K^T is recomputed (P = exp(S - L) is pointwise); O = P V is not"),
    ], hint="S has N x N entries per (b, h), each a length-d dot product")


def recompute_bytes_saved(answer, B: int, H: int, N: int, d: int) -> Verdict:
    """HBM bytes (counted) the recompute saves: stored's forward + backward minus flash's (atomic
    dQ, not causal) at (B, H, N, d). Stored and flash differ only in where P comes from."""
    want = _counted("stored", B, H, N, d) - _counted("flash", B, H, N, d)
    return exact(answer, want, "the byte count", hints=[
        (want / 2, "the tile data goes through HBM twice: written by the forward, read by the "
                   "backward"),
        (want / 4, "count bytes, 4 per fp32 element, and both trips through HBM"),
        (_counted("naive", B, H, N, d) - _counted("flash", B, H, N, d),
         "that is naive minus flash: fusion and recompute together; the recompute alone is "
         "stored against flash (same tiles, same launches)"),
    ], hint="subtract the two methods' traffic.totals(traffic.launches(...))['bytes'], or count "
            "what stored moves that flash does not")

