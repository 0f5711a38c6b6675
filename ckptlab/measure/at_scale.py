"""Activation memory and recompute FLOPs of one transformer layer at model scale, on paper.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
arXiv 2205.05198, section 4): a GPT layer with sequence length s, micro-batch b, hidden size h
and a heads, 16-bit activations, no tensor or sequence parallelism, holds for its backward

    none       s b h (34 + 5 a s / h) bytes   every activation: 34 s b h of them grow with h,
                                              5 a s^2 b with s^2: the softmax output (2), its
                                              dropout mask (1) and output (2); QK^T is not kept
    selective  34 s b h                       the attention core is recomputed (their proposal)
    flash      34 s b h + 4 a s b             FlashAttention's own recompute: nothing a s^2 is
                                              kept, only the logsumexp L (fp32, a s b numbers)
    full       2 s b h                        only the layer's input; the whole layer recomputed

Matmul FLOPs of the layer's forward: 24 b s h^2 + 4 b s^2 h = 24 b s h^2 (1 + s / (6 h));
backward twice that. What each choice recomputes in the backward: selective the attention core
(Q K^T and P V, 4 b s^2 h), flash only S = Q K^T (2 b s^2 h), full the whole forward.
"""

from __future__ import annotations

RECOMPUTE = ("none", "selective", "flash", "full")

# GPT-3 175B (Brown et al. 2020; Korthikanti et al. 2022, Table 3): sequence 2048, hidden 12288,
# 96 heads, 96 layers; micro-batch 1.
GPT3 = dict(s=2048, b=1, h=12288, a=96, layers=96)


def _check(s, b, h, a, recompute) -> None:
    for name, x in (("s", s), ("b", b), ("h", h), ("a", a)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ValueError(f"{name}: expected a positive int, got {x!r}")
    if h % a:
        raise ValueError(f"h = {h} must be divisible by the number of heads a = {a}")
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute: expected one of {RECOMPUTE}, got {recompute!r}")


def layer_activation_bytes(s: int, b: int, h: int, a: int, recompute: str = "none") -> int:
    """Bytes one layer holds for its backward (16-bit activations), per the table above."""
    _check(s, b, h, a, recompute)
    if recompute == "full":
        return 2 * s * b * h
    held = 34 * s * b * h
    if recompute == "none":
        held += 5 * a * s * s * b
    elif recompute == "flash":
        held += 4 * a * s * b  # L = m + log l, fp32, one per (head, query)
    return held


def layer_forward_flops(s: int, b: int, h: int) -> int:
    """Matmul FLOPs of one layer's forward: 24 b s h^2 (QKV, projection, MLP) + 4 b s^2 h
    (Q K^T and P V)."""
    return 24 * b * s * h * h + 4 * b * s * s * h


def layer_recompute_flops(s: int, b: int, h: int, a: int, recompute: str = "none") -> int:
    """FLOPs one layer's backward spends redoing forward work."""
    _check(s, b, h, a, recompute)
    return {"none": 0, "selective": 4 * b * s * s * h, "flash": 2 * b * s * s * h,
            "full": layer_forward_flops(s, b, h)}[recompute]


def table(s: int, b: int, h: int, a: int, layers: int = 1) -> list[dict]:
    """One row per recompute choice: activation bytes for `layers` layers, the saving against
    none, and the recompute FLOPs as a fraction of the forward and of the training step
    (forward + backward = 3 forwards), i.e. HFU / MFU - 1."""
    base = layer_activation_bytes(s, b, h, a, "none")
    fwd = layer_forward_flops(s, b, h)
    rows = []
    for r in RECOMPUTE:
        held, extra = layer_activation_bytes(s, b, h, a, r), layer_recompute_flops(s, b, h, a, r)
        rows.append(dict(recompute=r, bytes=layers * held, saving=1 - held / base,
                         recompute_over_forward=extra / fwd, hfu_over_mfu=1 + extra / (3 * fwd)))
    return rows
