"""Activation memory and recompute FLOPs of one transformer layer at model scale, on paper.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
arXiv 2205.05198, section 4 and Table 2): a GPT layer with sequence length s, micro-batch b,
hidden size h and a heads, 16-bit activations, holds for its backward, per GPU, with tensor
parallelism over t GPUs (t = 1: none) and optionally sequence parallelism (sp):

                   t = 1                 tensor parallel t            t and sequence parallel
    none       s b h (34 + 5 a s / h)   s b h (10 + 24/t + 5as/(ht))  s b h / t (34 + 5 a s / h)
    selective  34 s b h                 s b h (10 + 24/t)             34 s b h / t
    flash      34 s b h + 4 a s b       s b h (10 + 24/t) + 4asb/t    (34 s b h + 4 a s b) / t
    full       2 s b h                  2 s b h                       2 s b h / t

Where the terms come from (per layer): 34 s b h = 16 s b h activations of 2 bytes (LayerNorm
inputs 2, QKV input 1, MLP input 1: replicated across a tensor-parallel group; Q, K, V 3,
projection input 1, GeLU input 4 and output 4: split over t) plus 2 s b h dropout masks of 1
byte (replicated); 5 a s^2 b = the softmax output and its dropout output (2 bytes each) and
the dropout mask (1 byte), split over t with the heads. Sequence parallelism splits the
replicated part over t as well. selective recomputes the attention core (their proposal);
flash never stores it either, keeping only the logsumexp L (fp32, a s b numbers); full keeps only
the layer's input, which sequence parallelism splits over the t GPUs along the sequence (their
Table 2's 2 s b h for full recompute is one GPU's share without it). `bytes_per_value` changes
the 2 bytes of an activation (4 for fp32, as the CPU measurement in ckptlab.torch.parallel
uses); masks stay 1 byte, L 4.

Matmul FLOPs of the layer's forward: 24 b s h^2 + 4 b s^2 h = 24 b s h^2 (1 + s / (6 h));
backward twice that. What each choice recomputes in the backward: selective the attention core
(Q K^T and P V, 4 b s^2 h), flash only S = Q K^T (2 b s^2 h), full the whole forward.
"""

from __future__ import annotations

RECOMPUTE = ("none", "selective", "flash", "full")

# GPT-3 175B (Brown et al. 2020, Table 2.1): sequence 2048, hidden 12288, 96 heads, 96 layers.
# Brown et al. publish no parallel layout; Korthikanti et al. 2022 (Table 3) run it at tensor
# parallel 8, pipeline 8, micro-batch 1, and that is the t = 8 used here.
GPT3 = dict(s=2048, b=1, h=12288, a=96, layers=96)
GPT3_TP = 8


def _check(s, b, h, a, recompute, t=1, bytes_per_value=2) -> None:
    for name, x in (("s", s), ("b", b), ("h", h), ("a", a), ("t", t),
                    ("bytes_per_value", bytes_per_value)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ValueError(f"{name}: expected a positive int, got {x!r}")
    if h % a:
        raise ValueError(f"h = {h} must be divisible by the number of heads a = {a}")
    if a % t:
        raise ValueError(f"a = {a} heads must be divisible by the tensor-parallel size t = {t}")
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute: expected one of {RECOMPUTE}, got {recompute!r}")


def layer_activation_bytes(s: int, b: int, h: int, a: int, recompute: str = "none", t: int = 1,
                           sp: bool = False, bytes_per_value: int = 2) -> int:
    """Bytes one layer holds for its backward on each of t tensor-parallel GPUs (sp: with
    sequence parallelism too), per the table above; exact when t divides s, h and a."""
    _check(s, b, h, a, recompute, t, bytes_per_value)
    w, sbh = bytes_per_value, s * b * h
    if recompute == "full":
        return w * sbh // (t if sp else 1)  # the layer's input: 2 s b h at 16 bits, / t with SP
    replicated = (4 * w + 2) * sbh  # LN, QKV and MLP inputs; two dropout masks: 10 s b h
    split = 12 * w * sbh  # Q, K, V, projection input, GeLU input and output: 24 s b h
    core = (2 * w + 1) * a * s * s * b  # softmax output, dropout mask and output: 5 a s^2 b
    held = replicated // t if sp else replicated
    held += split // t
    if recompute == "none":
        held += core // t
    elif recompute == "flash":
        held += 4 * a * s * b // t  # L = m + log l, fp32, one per (head, query)
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


def table(s: int, b: int, h: int, a: int, layers: int = 1, t: int = 1,
          sp: bool = False) -> list[dict]:
    """One row per recompute choice: activation bytes per GPU for `layers` layers (tensor
    parallel t, sequence parallel sp), the saving against none with the same parallelism, and
    the recompute FLOPs as a fraction of the forward and of the training step (forward +
    backward = 3 forwards), i.e. HFU / MFU - 1."""
    base = layer_activation_bytes(s, b, h, a, "none", t, sp)
    fwd = layer_forward_flops(s, b, h)
    rows = []
    for r in RECOMPUTE:
        held = layer_activation_bytes(s, b, h, a, r, t, sp)
        extra = layer_recompute_flops(s, b, h, a, r)
        rows.append(dict(recompute=r, t=t, sp=sp, bytes=layers * held, saving=1 - held / base,
                         recompute_over_forward=extra / fwd, hfu_over_mfu=1 + extra / (3 * fwd)))
    return rows


# Two accountings of HFU / MFU for selective recompute, which differ (say which one a number
# uses). The lab's, from first principles: the recompute redoes Q K^T and P V, 4 b s^2 h a
# layer, against a training step's 72 b s h^2 (1 + s/(6h) + V/(12 h L)) a layer. Korthikanti et
# al. 2022's (their Eq. 7 and 8, appendix A): hardware FLOPs 72 B L s h^2 (1 + s/(3h) + V/(12hL)),
# which counts 12 b s^2 h a layer for the recompute, so HFU / MFU is about 1 + s/(6h); their
# published utilisations (Megatron-LM README's table: 175B MFU 51.4%, HFU 52.8%) follow it.
ACCOUNTINGS = ("first principles", "Korthikanti")


def step_flops(s: int, b: int, h: int, layers: int, vocab: int) -> int:
    """Model FLOPs of one sequence batch's training step (forward + backward, no recompute):
    72 b L s h^2 (1 + s/(6h) + V/(12 h L)) = L (72 b s h^2 + 12 b s^2 h) + 6 b s h V."""
    return layers * 3 * layer_forward_flops(s, b, h) + 6 * b * s * h * vocab


def hfu_over_mfu(s: int, h: int, layers: int, vocab: int, recompute: str = "selective",
                 accounting: str = "first principles") -> float:
    """Hardware FLOPs over model FLOPs of a step (the head included) under `accounting`:
    "first principles" counts what the recompute redoes (layer_recompute_flops; 1.009 for
    GPT-3 with selective recompute), "Korthikanti" their Eq. 8 for selective recompute (1.027)
    and an extra forward of every layer for full recompute (both accountings agree there)."""
    if accounting not in ACCOUNTINGS:
        raise ValueError(f"accounting: expected one of {ACCOUNTINGS}, got {accounting!r}")
    _check(s, 1, h, 1, recompute)
    model = step_flops(s, 1, h, layers, vocab)
    if accounting == "Korthikanti" and recompute == "selective":
        return (1 + s / (3 * h) + vocab / (12 * h * layers)) / \
               (1 + s / (6 * h) + vocab / (12 * h * layers))
    if recompute in ("none", "full"):
        extra = layers * (layer_forward_flops(s, 1, h) if recompute == "full" else 0)
    else:
        extra = layers * {"selective": 4, "flash": 2}[recompute] * s * s * h
    return 1 + extra / model
