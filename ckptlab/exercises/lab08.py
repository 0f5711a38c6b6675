"""Checkers of labs/08_when_recompute_pays.ipynb (the roofline's call on FLOPs for bytes: where
recompute stops paying, on CUDA cores and on tensor cores), one per exercise.

The expected values come from ckptlab itself (the traffic models, the time model), never typed
in, so an exercise follows the kernels if they change.
"""

from __future__ import annotations

from ckptlab.exercises.verdict import (
    NOT_YET,
    Verdict,
    close,
    number,
    right,
    unanswered,
    wrong,
)
from ckptlab.measure import crossing, roofline, traffic, traffic_tc

CROSSING = dict(N=4096, B=1, H=16)  # the sweep exercise 1 asks about (every launch fills waves)
DIMS = (32, 64, 96, 128)  # the head dims it sweeps: both sides of 2 R / 3 = 102 on an A100


def crossing_d(answer, gpu: str = "A100", dtype: str = "bf16") -> Verdict:
    """The smallest head dim d of DIMS at which the recompute gain (stored / flash modeled
    time, unique bytes, at CROSSING's size) falls below 1 on `gpu` in `dtype`; the string
    "never" if it stays above 1 up to the largest d."""
    if unanswered(answer):  # before the sweep: nothing to compute for an empty answer
        return Verdict(NOT_YET)
    name = roofline.spec(gpu)["name"]
    rows = crossing.recompute_gains([name], [dtype], DIMS, **CROSSING)
    want = crossing.crossings(rows)[name, dtype]
    if isinstance(answer, str) and answer.strip().lower() == "never":
        return right() if want is None else wrong(
            f"on {name} in {dtype} the gain does fall below 1 within d <= {max(DIMS)}")
    got, bad = number(answer, "d")
    if bad:
        return bad
    if got not in DIMS:
        return wrong(f"the sweep has d in {DIMS}: give the smallest of them where the gain "
                     "is below 1 (or \"never\")")
    if got == want:
        return right()
    if want is None:
        return wrong(f"on {name} in {dtype} the gain stays above 1 for every d of the sweep")
    other = "fp32" if dtype != "fp32" else "bf16"
    theirs = crossing.crossings(crossing.recompute_gains([name], [other], DIMS,
                                                           **CROSSING))[name, other]
    if got == theirs:
        return wrong(f"that is the {other} crossing: {dtype} has its own ridge and kernels")
    gain = {r["d"]: r["gain_unique"] for r in rows}[int(got)]
    side = "still pays." if gain > 1 else "already costs: is it the first d where it does?"
    return wrong(f"at d = {int(got)} the modeled gain is {gain:.2f}: recompute {side} Which "
                 f"ridge R does {name} have in {dtype} (roofline.ridge_point), and which rule "
                 "did you use: d < 2 R / 3 (launches one after another, what the model does) or "
                 "4 R / 7 (perfect overlap)?")


def flash_intensity(answer, B: int = 1, H: int = 1, N: int = 1024, d: int = 64) -> Verdict:
    """Arithmetic intensity (hardware FLOPs per HBM byte) of the bf16 flash pair on tensor
    cores, forward + deterministic backward, not causal: what decides, against a GPU's ridge,
    whether its recomputed FLOPs cost time."""
    runs = traffic_tc.tc_launches("flash", B, H, N, N, d, deterministic=True)
    tot = traffic.totals(runs)
    want = tot["flops"] / tot["bytes"]
    fp32 = traffic.totals(traffic.flash_forward_traffic(B, H, N, N, d)
                          + traffic.flash_backward_traffic(B, H, N, N, d, deterministic=True))
    useful = (traffic.model_flops(B, H, N, N, d)
              + traffic.model_flops(B, H, N, N, d, backward=True)) / tot["bytes"]
    return close(answer, want, "the intensity", 0.02, hints=[
        (fp32["flops"] / fp32["bytes"], "that is the fp32 pair's: the bf16 one moves half the "
                                        "bytes for the same FLOPs"),
        (useful, "count the FLOPs the kernels execute (hardware FLOPs): the backward recomputes "
                 "S, and the deterministic dQ kernel S and dP once more"),
    ], hint="hardware FLOPs over bytes of every launch (forward, preprocess, dK/dV, dQ)")
