"""Checkers of labs/09_segment_checkpointing.ipynb, one function per exercise.

The expected values come from ckptlab itself (the traffic models, the roofline, the float64
reference), never typed in, so an exercise follows the kernels if they change.
"""

from __future__ import annotations

from ckptlab.exercises.verdict import NOT_YET, Verdict, close, number, right, unanswered, wrong
from ckptlab.exercises.write import in_notebook as write_kernel  # noqa: F401 (the labs' kernel cells)
from ckptlab.recompute import schedules


def least_memory_segments(answer, prof) -> Verdict:
    """The number k of uniform checkpointed segments (schedules.uniform(L, k)) that gives the
    chain profiled in `prof` the least predicted peak of saved bytes. Only a k with that least
    peak is right (ties all are); any other is told how far above the least it peaks, and in
    which direction to look, never the optimum."""
    L = prof.n_blocks
    peaks = {k: schedules.uniform(L, k).predict(prof).peak_bytes for k in range(1, L + 1)}
    least = min(peaks.values())
    best = [k for k, p in peaks.items() if p == least]
    if unanswered(answer):
        return Verdict(NOT_YET)
    got, bad = number(answer, "k")
    if bad:
        return bad
    if got != int(got) or not 1 <= got <= L:
        return wrong(f"k is a whole number of segments from 1 to L = {L}; you gave {answer!r}")
    k = int(got)
    if peaks[k] == least:
        return right()
    side = ("more segments: each recompute holds L / k blocks' activations at once" if k < best[0]
            else "fewer segments: each one holds its input until the backward reaches it")
    return wrong(f"k = {k} peaks at {peaks[k]:,} bytes, {peaks[k] / least - 1:.1%} above the "
                  "least any k reaches; the estimate sqrt(L a / x) only points near it "
                  f"(segments of unequal length, the head): try {side}")


def checkpoint_flops_ratio(answer, prof) -> Verdict:
    """Hardware FLOPs / model FLOPs (= HFU / MFU) of one training step of the chain profiled in
    `prof` under the sqrt schedule (every block checkpointed once)."""
    pred = schedules.sqrt(prof.n_blocks).predict(prof)
    return close(answer, pred.hardware_flops / pred.model_flops, "the ratio", 0.01, hints=[
        (2.0, "the recompute is one more forward per block, not a forward and a backward"),
        (1.5, "a backward costs about twice a forward, so a step is about three forwards"),
    ], hint="hardware = model + one extra forward of the blocks; backward ~ 2 x forward")

