"""GPT's layer on paper (GPT-2 / GPT-3: LayerNorm, a 4h GeLU MLP with biases, dropout): the bytes
it keeps for its backward and its element-wise kernels' HBM bytes, the formulas GPTShape
answers with (ckptlab.cluster.model_shape). step_memory and step_time re-export them.
"""

from __future__ import annotations

from ckptlab.cluster import at_scale


def layer_activations(s: int, b: int, h: int, a: int, recompute: str = "none", t: int = 1,
                      sp: bool = False, bytes_per_value: int = 2, dropout: bool = True,
                      ln_stats: bool = False) -> int:
    """Bytes one layer keeps for its backward on one GPU: Korthikanti's (at_scale), less the
    dropout masks and outputs when there is no dropout, plus LayerNorm's statistics."""
    held = at_scale.layer_activation_bytes(s, b, h, a, recompute, t, sp, bytes_per_value)
    if recompute == "full":
        return held
    w, rep = bytes_per_value, (t if sp else 1)
    if not dropout:
        held -= 2 * s * b * h // rep  # two 1-byte masks after the attention and the MLP
        if recompute == "none":
            held -= (w + 1) * a * s * s * b // t  # the probabilities' mask and dropout output
    if ln_stats:
        held += 16 * s * b // rep
    return held


def elementwise_bytes(s: int, b: int, h: int, t: int = 1, sp: bool = False, w: int = 2,
                      dropout: bool = True) -> int:
    """HBM bytes of one layer's forward outside its matmuls and attention core: the fused
    kernels Megatron-LM runs between its GEMMs, each reading its inputs and writing its output
    once (w bytes a value, masks 1 byte). Per s b h: LayerNorm 2 x (read, write) 4w; the two
    bias-dropout-residual adds 2 x (read the output and the residual, write, the mask) 2 (3w + 1)
    (both replicated over t, split with SP); the QKV bias (read, write 3h) 6w and the fused
    bias-GeLU (read, write 4h) 8w, split over t. Without dropout the adds write no mask."""
    sbh = s * b * h
    replicated = (4 * w + 2 * (3 * w + (1 if dropout else 0))) * sbh
    return (replicated // t if sp else replicated) + 14 * w * sbh // t
