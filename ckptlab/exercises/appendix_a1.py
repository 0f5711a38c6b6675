"""Checkers of labs/A1_hfu_mfu_and_fig2.ipynb (an appendix: HFU and MFU, the FlashAttention
paper's Fig. 2 read right), one function per exercise.

The expected values come from ckptlab itself (the traffic models' FLOP counts), never typed in,
so an exercise follows the kernels if they change.
"""

from __future__ import annotations

from ckptlab.exercises.verdict import Verdict, close
from ckptlab.measure import traffic


def hfu_over_mfu(answer, B: int = 64, H: int = 16, N: int = 1024, d: int = 64) -> Verdict:
    """HFU / MFU of flash attention's forward + backward (atomic dQ, not causal): hardware
    FLOPs (recompute included) over model FLOPs (useful work), at the same time."""
    runs = traffic.launches("flash", B, H, N, N, d)
    hw = traffic.totals(runs)["flops"]
    fwd = traffic.model_flops(B, H, N, N, d)
    model = fwd + traffic.model_flops(B, H, N, N, d, backward=True)
    bwd_hw = hw - sum(kt.flops for kt in runs if "_fwd" in kt.kernel)
    return close(answer, hw / model, "the ratio", 0.01, hints=[
        (bwd_hw / (model - fwd),
         "that is the backward alone: the forward (no recompute) is in both counts"),
        (1.0, "the recompute of S is executed (hardware FLOPs) but is not useful work"),
    ], hint="per (i, j) pair: forward 4 d, backward 8 d useful, plus 2 d recomputed")


def fig2_model_gflops(answer, B: int = 64, H: int = 16, N: int = 1024, d: int = 64) -> Verdict:
    """Model FLOPs (useful matmul work, forward + backward, every head; not causal) of standard
    attention at (B, H, N, d), in GFLOPs: what Fig. 2's 66.6 GFLOPs should have counted."""
    model = (traffic.model_flops(B, H, N, N, d)
             + traffic.model_flops(B, H, N, N, d, backward=True)) / 1e9
    hw_flash = traffic.totals(traffic.launches("flash", B, H, N, N, d))["flops"] / 1e9
    return close(answer, model, "the GFLOPs", 0.01, hints=[
        (model / H, "that is one head's: the batch has H heads"),
        (model / 2, "a multiply-add is 2 FLOPs"),
        (hw_flash, "that counts what flash runs, recompute included: standard attention "
                   "recomputes nothing"),
        (traffic.model_flops(B, H, N, N, d) / 1e9, "the backward does useful work too"),
    ], hint="which matmuls run per (i, j) pair, forward and backward, and for how many pairs?")
