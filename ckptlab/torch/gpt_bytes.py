"""What ckptlab.torch.nets.GPT saves for its backward, on paper (modeled bytes), for each
attention it can run: the terms of ckptlab.cluster.step_memory (Korthikanti et al.'s table in
fp32, no dropout, LayerNorm statistics counted) with the attention core that really runs, and
one stage of the model holding several micro-batches at once (ckptlab.torch.pipelined).

    layer_bytes(s, b, h, a, "flash", "none")       # one block, nothing recomputed
    stage_bytes(GPTShape(...), b, blocks=2, first=True, last=False, recompute="full",
                attn="flash", in_flight=3, batch=8)  # peak saved bytes of that stage

Per block, the attention core (s the sequence, b the sequences, h the width, a the heads,
w = 4 bytes a value):
  math, naive  Korthikanti's standard attention: Q, K, V and the probabilities P (w a s^2 b);
  flash        ckptlab's kernel keeps Q, K, V, O and L (4 a s b, fp32) instead of P; O is kept
               apart from the out projection's input, a transposed copy of it (w s b h), except
               with one head or one position, where the transpose is a view (transposed_copy);
  stored       ckptlab's fused kernel with P written: P, and O and L besides;
  sdpa         on the CPU, PyTorch's flash kernel: Q, K, V, O and its logsumexp; O is laid out
               (b, s, a, d), so the out projection's input is a view of it, no copy. On a GPU
               SDPA picks another backend with another saved set: not modeled (None).
A recompute (every block checkpointed: step_memory's "full") keeps each block's input and, in a
block's backward, holds that block's whole saved set again.
"""

from __future__ import annotations

from ckptlab.cluster import step_memory

W = 4  # bytes of an fp32 value: the demos train in fp32
ATTENTION = ("naive", "stored", "flash", "sdpa", "math")  # the kinds modeled (nets.ATTENTION)
RECOMPUTE = ("none", "full")


def _check(attn: str, recompute: str) -> None:
    if attn not in ATTENTION:
        raise ValueError(f"attn: expected one of {ATTENTION}, got {attn!r}")
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute: expected one of {RECOMPUTE}, got {recompute!r}")


def layer_bytes(s: int, b: int, h: int, a: int, attn: str, recompute: str = "none") -> int:
    """Bytes one block keeps for its backward: "full", its input; "none", everything it saves
    with the attention `attn` (see the module's docstring)."""
    _check(attn, recompute)
    kw = dict(bytes_per_value=W, dropout=False, ln_stats=True)
    if recompute == "full":
        return step_memory.layer_activations(s, b, h, a, "full", **kw)
    if attn in ("math", "naive"):
        return step_memory.layer_activations(s, b, h, a, "none", **kw)
    o_apart = W * s * b * h if transposed_copy(s, a) else 0
    if attn == "stored":  # P as the standard attention keeps it, and O and L besides
        return step_memory.layer_activations(s, b, h, a, "none", **kw) + o_apart \
            + 4 * a * s * b
    flash = step_memory.layer_activations(s, b, h, a, "flash", **kw)  # L instead of P
    return flash + (o_apart if attn == "flash" else 0)


def transposed_copy(s: int, a: int) -> bool:
    """Whether the out projection's input is a copy of the kernel's O (B, a, s, d) rather than a
    view of it: O.transpose(1, 2) is laid out as a contiguous (B, s, a, d) only when a = 1 or
    s = 1, and then reshape returns a view, so O and the input share one storage."""
    return a > 1 and s > 1


def embed_bytes(s: int, b: int) -> int:
    """The embeddings' saved int64 token ids (b, s) and position ids (s)."""
    return 8 * s * b + 8 * s


def head_bytes(s: int, b: int, h: int, vocab: int) -> int:
    """The head and its loss: the LayerNorm's input and output (w s b h each) and its fp32
    statistics, the fp32 log-softmax of the logits, the int64 targets, the loss's fp32 total
    weight (step_memory's head at t = 1)."""
    return 2 * W * s * b * h + 8 * s * b + 4 * s * b * vocab + 8 * s * b + 4


def stage_bytes(shape: step_memory.GPTShape, b: int, blocks: int, first: bool, last: bool,
                recompute: str, attn: str, in_flight: int = 1, batch: int | None = None,
                device: str = "cpu") -> int | None:
    """Peak saved bytes of a chain of `blocks` blocks of `shape` (with the embeddings if
    `first`, the head and loss if `last`) holding `in_flight` micro-batches of b sequences at
    once: each one's forward done, one of them in its backward.

    batch: the whole batch the micro-batches are slices of, when their token ids (first) and
    targets (last) are views of the caller's two tensors, as torch's pipeline schedules split
    them: a saved view holds its whole storage, once for all micro-batches (8 s batch bytes
    each), while any micro-batch holds it. None: each micro-batch owns its own. None is returned
    for SDPA on a GPU (not modeled)."""
    _check(attn, recompute)
    if attn == "sdpa" and device != "cpu":
        return None
    for name, x in (("b", b), ("blocks", blocks), ("in_flight", in_flight)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {x!r}")
    s, h, a, V = shape.seq, shape.hidden, shape.heads, shape.vocab
    whole = layer_bytes(s, b, h, a, attn, "none")
    one = layer_bytes(s, b, h, a, attn, recompute)
    ids = 8 * s * b if batch is not None else 0  # a micro-batch's ids or targets, if views
    views = 8 * s * batch if batch is not None else 0  # the whole storage each view holds
    embed = embed_bytes(s, b) if first else 0
    head = head_bytes(s, b, h, V) if last else 0
    end = embed + blocks * one + head  # one micro-batch at the end of its forward
    own = ids * (first + last)  # of which views, counted below once for all
    # every micro-batch at the end of its forward: each holds its ids and targets
    peak = in_flight * (end - own) + views * (first + last)
    if recompute == "full":
        # the last block recomputed (its input taken back, its whole set held) after the head's
        # backward released the targets: the others still hold theirs, and every id
        redo = embed + (blocks - 1) * one + whole - ids * first
        held = views * (first + (last and in_flight > 1))
        peak = max(peak, (in_flight - 1) * (end - own) + redo + held)
    return peak
