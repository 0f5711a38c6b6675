"""Checkers of labs/05_recompute_backward.ipynb (the recompute backward), one per exercise.

The expected values come from ckptlab itself (the traffic models, the roofline, the float64
reference), never typed in, so an exercise follows the kernels if they change.
"""

from __future__ import annotations

from ckptlab.exercises.verdict import Verdict, close, exact
from ckptlab.measure import traffic


def _flash_fwd_bwd(B, H, N, d, deterministic=False) -> dict:
    return traffic.totals(traffic.flash_forward_traffic(B, H, N, N, d)
                          + traffic.flash_backward_traffic(B, H, N, N, d,
                                                           deterministic=deterministic))


def recompute_flops(answer, B: int, H: int, N: int, d: int) -> Verdict:
    """FLOPs the flash backward (atomic dQ, not causal) spends recomputing S = scale Q K^T, for
    q, k, v of shape (B, H, N, d); matmul FLOPs, 2 per multiply-add, on the N x N scores (the
    kernel runs whole tiles: when N is not a multiple of them it executes more, traffic's
    hardware count)."""
    want = 2 * B * H * traffic.visible_pairs(N, N, False) * d
    (_, dkdv) = traffic.flash_backward_traffic(B, H, N, N, d)
    return exact(answer, want, "the FLOP count", hints=[
        (dkdv.recompute_flops, "that counts the padded tail tiles the kernel also runs; the "
                               "question asks for the N x N scores"),
        (want / 2, "a multiply-add is 2 FLOPs"),
        (2 * want, "only S = Q K^T is recomputed (P = exp(S - L) is pointwise); O = P V is not"),
    ], hint="S has N x N entries per (b, h), each a length-d dot product")


def hfu_over_mfu(answer, B: int = 64, H: int = 16, N: int = 1024, d: int = 64) -> Verdict:
    """HFU / MFU of flash attention's forward + backward (atomic dQ, not causal): hardware
    FLOPs (recompute included) over model FLOPs (useful work), at the same time."""
    hw = _flash_fwd_bwd(B, H, N, d)["flops"]
    model = (traffic.model_flops(B, H, N, N, d)
             + traffic.model_flops(B, H, N, N, d, backward=True))
    bwd = traffic.totals(traffic.flash_backward_traffic(B, H, N, N, d))["flops"]
    return close(answer, hw / model, "the ratio", 0.01, hints=[
        (bwd / traffic.model_flops(B, H, N, N, d, backward=True),
         "that is the backward alone: the forward (no recompute) is in both counts"),
        (1.0, "the recompute of S is executed (hardware FLOPs) but is not useful work"),
    ], hint="per (i, j) pair: forward 4 d, backward 8 d useful, plus 2 d recomputed")


def fig2_bytes_ratio(answer, B: int = 64, H: int = 16, N: int = 1024, d: int = 64) -> Verdict:
    """Naive HBM bytes / flash HBM bytes for forward + backward at (B, H, N, d) (GPT-2 medium in
    FlashAttention's Fig. 2 by default), from ckptlab's kernels (the traffic models)."""
    naive = traffic.totals(traffic.naive_forward_traffic(B, H, N, N, d)
                           + traffic.naive_backward_traffic(B, H, N, N, d))["bytes"]
    want = naive / _flash_fwd_bwd(B, H, N, d)["bytes"]
    return close(answer, want, "the ratio", 0.02, hint="sum the bytes of every launch of each "
                  "method (traffic.totals) and divide")
