"""What ckptlab.torch.llama.Llama saves for its backward, on paper (modeled bytes), from the
cluster's Llama layer (ckptlab.cluster.llama_layer.LlamaShape) in fp32 with the RMSNorms' rstd
counted, for one process, one FSDP rank (its slice of the batch) or one pipeline stage holding
several micro-batches at once.

    stage_bytes(cfg, b, blocks=range(0, 2), first=True, last=True)   # the whole model
    stage_bytes(cfg, b, range(2, 5), False, False, in_flight=2, batch=8)   # a middle stage

Per block, LlamaShape.layer_activations with the attention the model runs: "math" keeps the
probabilities (the shape's "none"), "sdpa" (PyTorch's CPU flash kernel) the logsumexp (the
shape's "flash"). Once a stage: RoPE's cos and sin tables (rope_saved). The first stage: the
int64 token ids; the last: the final RMSNorm's input, rstd and output, the fp32 log-softmax,
the int64 targets and the loss's fp32 total weight (step_memory's head with PyTorch's loss).
torch's pipeline schedules split the batch's ids and targets into views of the caller's two
tensors: a saved view holds its whole storage (8 s batch bytes), once for all micro-batches.
"""

from __future__ import annotations

from ckptlab.cluster.llama_layer import LlamaShape

W = 4  # fp32
KIND = {"math": "none", "sdpa": "flash"}  # the attention run -> the shape's recompute choice


def shape_of(cfg) -> LlamaShape:
    """The LlamaShape of a ckptlab.torch.llama.LlamaConfig."""
    return LlamaShape(cfg.layers, cfg.width, cfg.heads, cfg.kv_heads, cfg.ffn, cfg.seq,
                      cfg.vocab)


def layer_bytes(cfg, b: int) -> int:
    """Bytes one block keeps for b sequences."""
    return shape_of(cfg).layer_activations(b, KIND[cfg.attn], bytes_per_value=W,
                                           ln_stats=True)


def head_bytes(cfg, b: int) -> int:
    s, h = cfg.seq, cfg.width
    return 2 * W * s * b * h + 4 * s * b + 4 * s * b * cfg.vocab + 8 * s * b + 4


def stage_bytes(cfg, b: int, blocks, first: bool, last: bool, in_flight: int = 1,
                batch: int | None = None) -> int:
    """Peak saved bytes of a stage holding `in_flight` micro-batches of b sequences, each with
    its forward done (module docstring); batch: the batch the ids and targets are views of."""
    shape = shape_of(cfg)
    ids = 8 * cfg.seq * b
    end = len(blocks) * layer_bytes(cfg, b) + (shape.embed_saved(b) if first else 0) \
        + (head_bytes(cfg, b) if last else 0)
    if batch is None:
        return in_flight * end + shape.rope_saved()
    own = ids * (first + last)
    return in_flight * (end - own) + 8 * cfg.seq * batch * (first + last) + shape.rope_saved()
