"""What a training run's memory and time are modeled for: the shape of a GPT (GPTShape) and the
layout of its GPUs (Layout), each checked when made, so that a bad size fails where it is
written. ckptlab.cluster.step_memory re-exports both.

    GPTShape(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200)
    Layout(dp=16, tp=8, sp=True, zero=1, micro_batch=1, pp=8, vp=3)
"""

from __future__ import annotations

from dataclasses import dataclass


def _positive(name, x) -> None:
    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
        raise ValueError(f"{name}: expected a positive int, got {x!r}")


@dataclass(frozen=True)
class GPTShape:
    """A GPT-2 style transformer: L layers of hidden h, a heads, 4h MLP, learned positions."""

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    tied: bool = True  # the head shares the token embedding (GPT-2, GPT-3)

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "seq", "vocab"):
            _positive(name, getattr(self, name))
        if self.hidden % self.heads:
            raise ValueError(f"heads = {self.heads} must divide the hidden size {self.hidden}")
        if not isinstance(self.tied, bool):
            raise ValueError(f"tied: expected True or False, got {self.tied!r}")

    def layer_params(self, t: int = 1) -> int:
        """One layer's parameters on one of t tensor-parallel ranks (Megatron's split: QKV and
        fc by columns with their biases, out and proj by rows; the row-split biases and the
        LayerNorms replicated): (12 h^2 + 7 h) / t + 6 h; t = 1: 12 h^2 + 13 h."""
        h = self.hidden
        return (12 * h * h + 7 * h) // t + 6 * h

    def params(self, t: int = 1) -> int:
        """All parameters on one tensor-parallel rank: layers, vocab-parallel token embedding,
        positions and the final LayerNorm (replicated), an untied head split by vocabulary."""
        return self.stage_params(t, 1, 0)

    def stage_params(self, t: int, p: int, stage: int) -> int:
        """Parameters on one GPU of pipeline stage `stage` of p: its L / p layers; the token
        and position embeddings on stage 0; the final LayerNorm and the head on stage p - 1 (a
        tied head is the embedding itself when p = 1, a copy on the last stage when p > 1)."""
        h, V = self.hidden, self.vocab
        psi = self.layers // p * self.layer_params(t)
        if stage == 0:
            psi += V * h // t + self.seq * h
        if stage == p - 1:
            psi += 2 * h + (V * h // t if not self.tied or p > 1 else 0)
        return psi


@dataclass(frozen=True)
class Layout:
    """Parallel degrees: dp data-parallel ranks (ZeRO shards over them), tp tensor-parallel,
    sp sequence parallelism (within tp), zero stage 0-3 (3 = FSDP full shard), micro-batch,
    pp pipeline stages, vp virtual stages (chunks) per GPU (vp > 1: interleaved 1F1B); zero3
    the ZeRO-3 implementation, "fsdp" (PyTorch) or "deepspeed" (ckptlab.cluster.zero3)."""

    dp: int = 1
    tp: int = 1
    sp: bool = False
    zero: int = 0
    micro_batch: int = 1
    pp: int = 1
    vp: int = 1
    zero3: str = "fsdp"

    def __post_init__(self):
        for name in ("dp", "tp", "micro_batch", "pp", "vp"):
            _positive(name, getattr(self, name))
        if not isinstance(self.sp, bool):
            raise ValueError(f"sp: expected True or False, got {self.sp!r}")
        if isinstance(self.zero, bool) or self.zero not in (0, 1, 2, 3):
            raise ValueError(f"zero: expected a ZeRO stage 0, 1, 2 or 3, got {self.zero!r}")
        if self.zero3 not in ("fsdp", "deepspeed"):
            raise ValueError(f"zero3: expected 'fsdp' or 'deepspeed', got {self.zero3!r}")
        if self.vp > 1 and self.pp < 2:
            raise ValueError(f"vp = {self.vp} virtual stages need a pipeline (pp >= 2)")

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp
