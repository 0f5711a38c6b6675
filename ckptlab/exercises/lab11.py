"""Checkers of labs/11_activations_at_scale.ipynb, one function per exercise.

The expected values come from ckptlab itself (Korthikanti et al.'s formula in
ckptlab.cluster.at_scale, the Llama layer's in ckptlab.cluster.llama_layer), never typed in.
"""

from __future__ import annotations

from ckptlab.cluster import at_scale
from ckptlab.cluster.llama_layer import LlamaShape
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



def llama_layer_bytes(answer, s: int, b: int, h: int, a: int, kv: int, ffn: int) -> Verdict:
    """Bytes one Llama layer holds for its backward with FlashAttention (16-bit, no dropout):
    sequence s, micro-batch b, hidden h, a query heads, kv key/value heads, SwiGLU width ffn
    (ckptlab.cluster.llama_layer)."""
    shape = LlamaShape(1, h, a, kv, ffn, s, 1)
    want = shape.layer_activations(b, "flash")
    full_kv = LlamaShape(1, h, a, a, ffn, s, 1).layer_activations(b, "flash")
    return exact(answer, want, "the byte count", hints=[
        (at_scale.layer_activation_bytes(s, b, h, a, "flash"),
         "that is GPT's layer (a 4h GeLU MLP with dropout): count the SwiGLU's four ffn-wide "
         "tensors and no masks"),
        (full_kv, "K and V are only kv heads of h / a values each (grouped-query attention)"),
        (want - 4 * a * s * b, "FlashAttention keeps one fp32 number per head and query too"),
    ], hint="4 s b h for the two RMSNorms' inputs and outputs, then Q, K, V, the attention "
            "output and SwiGLU's tensors, at 2 bytes")
