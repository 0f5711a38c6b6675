"""Checkers of labs/11_activations_at_scale.ipynb, one function per exercise.

The expected values come from ckptlab itself (Korthikanti et al.'s formula in
ckptlab.cluster.at_scale), never typed in.
"""

from __future__ import annotations

from ckptlab.cluster import at_scale
from ckptlab.exercises.verdict import Verdict, close, exact


def korthikanti_bytes(answer, s: int, b: int, h: int, a: int) -> Verdict:
    """Bytes of activations one transformer layer holds for its backward with no recompute
    (Korthikanti et al. 2022, 16-bit): sequence s, micro-batch b, hidden h, a heads."""
    want = at_scale.layer_activation_bytes(s, b, h, a, "none")
    return exact(answer, want, "the byte count", hints=[
        (at_scale.layer_activation_bytes(s, b, h, a, "selective"),
         "that leaves out the attention core's 5 a s^2 b bytes (the softmax output, the "
         "dropout mask and the dropout output)"),
    ], hint="s b h (34 + 5 a s / h)")


def selective_saving(answer, s: int, b: int, h: int, a: int) -> Verdict:
    """The fraction of one layer's activation bytes that selective recompute (of the attention
    core) saves against none: 1 - selective / none."""
    want = 1 - (at_scale.layer_activation_bytes(s, b, h, a, "selective")
                / at_scale.layer_activation_bytes(s, b, h, a, "none"))
    return close(answer, want, "the fraction", 0.01, hints=[
        (100 * want, "a fraction, not a percentage"),
    ], hint="the saved part is 5 a s / h out of 34 + 5 a s / h")

