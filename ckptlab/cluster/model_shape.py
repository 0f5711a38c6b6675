"""What a training run's memory and time are modeled for: the shape of a GPT (GPTShape) or a
Llama (ckptlab.cluster.llama_layer.LlamaShape) and the layout of its GPUs (Layout), each checked
when made, so that a bad size fails where it is written. ckptlab.cluster.step_memory re-exports
them.

    GPTShape(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200)
    Layout(dp=16, tp=8, sp=True, zero=1, micro_batch=1, pp=8, vp=3)

A shape answers everything the step models ask of its layer (Shape: parameters per layer and
per pipeline stage, FLOPs, activation bytes, element-wise bytes), so step_memory, step_time and
the planner read no layer's formula themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptlab.cluster import gpt_layer, pipeline


def _positive(name, x) -> None:
    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
        raise ValueError(f"{name}: expected a positive int, got {x!r}")


class Shape:
    """What a transformer shape shares: parameters by pipeline stage and FLOPs from its layer's
    (layer_params, layer_matmul_flops), the attention core's FLOPs (4 b s^2 h forward: Q K^T
    and P V over every query head) and what each recompute redoes (at_scale's accounting)."""

    dropout_layers = True  # whether the layer has dropout (its masks saved, launched)

    def params(self, t: int = 1) -> int:
        """All parameters on one tensor-parallel rank (stage_params with one stage)."""
        return self.stage_params(t, 1, 0)

    def stage_layers(self, p: int, stage: int) -> int:
        """Layers on pipeline stage `stage` of p (ckptlab.cluster.pipeline.split_layers)."""
        return pipeline.split_layers(self.layers, p)[stage] if p > 1 else self.layers

    def attention_flops(self, b: int) -> int:
        return 4 * b * self.seq * self.seq * self.hidden

    def layer_forward_flops(self, b: int) -> int:
        """Matmul FLOPs of one layer's forward, the attention core's included."""
        return self.layer_matmul_flops(b) + self.attention_flops(b)

    def head_flops(self, b: int) -> int:
        """The head's forward: 2 b s h V."""
        return 2 * b * self.seq * self.hidden * self.vocab

    def step_flops(self, batch: int) -> int:
        """Model FLOPs of a training step of `batch` sequences (forward + backward, no
        recompute): 3 L (a layer's forward) + 3 (the head's)."""
        return self.layers * 3 * self.layer_forward_flops(batch) + 3 * self.head_flops(batch)

    def recompute_flops(self, b: int, base: str) -> int:
        """FLOPs one layer's backward spends redoing forward work (at_scale's: selective the
        core, flash S = Q K^T, full the whole forward)."""
        core = self.attention_flops(b)
        return {"none": 0, "selective": core, "flash": core // 2,
                "full": self.layer_forward_flops(b)}[base]

    def rope_saved(self) -> int:
        """Bytes of constant tables every layer saves, once a stage (0: learned positions)."""
        return 0

    def tp_problem(self, t: int) -> str | None:
        """Why t tensor-parallel ranks cannot split this model, or None."""
        if self.hidden % t or self.vocab % t:
            return f"tp = {t} must divide the hidden size {self.hidden} and the vocabulary " \
                   f"{self.vocab}"
        if self.heads % t:
            return f"tp = {t} must divide the {self.heads} heads"
        return None


@dataclass(frozen=True)
class GPTShape(Shape):
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

    def stage_params(self, t: int, p: int, stage: int) -> int:
        """Parameters on one GPU of pipeline stage `stage` of p: its layers (L / p when p
        divides L); the token and position embeddings on stage 0; the final LayerNorm and the
        head on stage p - 1 (a tied head is the embedding itself when p = 1, a copy on the last
        stage when p > 1). All parameters on one rank: params(t)."""
        h, V = self.hidden, self.vocab
        psi = self.stage_layers(p, stage) * self.layer_params(t)
        if stage == 0:
            psi += V * h // t + self.seq * h
        if stage == p - 1:
            psi += 2 * h + (V * h // t if not self.tied or p > 1 else 0)
        return psi

    @property
    def kv_heads(self) -> int:
        return self.heads

    def layer_matmul_flops(self, b: int) -> int:
        """QKV, projection and the 4h MLP forward: 24 b s h^2."""
        return 24 * b * self.seq * self.hidden * self.hidden

    def layer_activations(self, b: int, recompute: str = "none", t: int = 1, sp: bool = False,
                          bytes_per_value: int = 2, dropout: bool = True,
                          ln_stats: bool = False) -> int:
        """Korthikanti's bytes a layer keeps (ckptlab.cluster.gpt_layer.layer_activations)."""
        return gpt_layer.layer_activations(self.seq, b, self.hidden, self.heads, recompute, t, sp,
                                 bytes_per_value, dropout, ln_stats)

    def embed_saved(self, b: int) -> int:
        """What the embeddings save: the int64 token ids and position ids."""
        return 8 * self.seq * b + 8 * self.seq

    norm_stats = 8  # bytes a token of one LayerNorm's fp32 mean and rstd

    def elementwise_bytes(self, b: int, t: int, sp: bool, w: int, dropout: bool) -> int:
        return gpt_layer.elementwise_bytes(self.seq, b, self.hidden, t, sp, w, dropout)

    def describe(self) -> str:
        return (f"GPT L={self.layers} h={self.hidden} a={self.heads} s={self.seq} "
                f"V={self.vocab}")


@dataclass(frozen=True)
class Layout:
    """Parallel degrees: dp data-parallel ranks (ZeRO shards over them), tp tensor-parallel,
    sp sequence parallelism (within tp), zero stage 0-3 (3 = FSDP full shard), micro-batch,
    pp pipeline stages, vp virtual stages (chunks) per GPU (vp > 1: interleaved 1F1B); zero3
    the ZeRO-3 implementation, "fsdp" (PyTorch) or "deepspeed" (ckptlab.cluster.zero3);
    offload the model states kept in host memory, "none", "optimizer" (ZeRO-Offload) or
    "params" (ZeRO-Infinity: ckptlab.cluster.zero_offload)."""

    dp: int = 1
    tp: int = 1
    sp: bool = False
    zero: int = 0
    micro_batch: int = 1
    pp: int = 1
    vp: int = 1
    zero3: str = "fsdp"
    offload: str = "none"

    def __post_init__(self):
        for name in ("dp", "tp", "micro_batch", "pp", "vp"):
            _positive(name, getattr(self, name))
        if not isinstance(self.sp, bool):
            raise ValueError(f"sp: expected True or False, got {self.sp!r}")
        if isinstance(self.zero, bool) or self.zero not in (0, 1, 2, 3):
            raise ValueError(f"zero: expected a ZeRO stage 0, 1, 2 or 3, got {self.zero!r}")
        if self.zero3 not in ("fsdp", "deepspeed"):
            raise ValueError(f"zero3: expected 'fsdp' or 'deepspeed', got {self.zero3!r}")
        if self.offload not in ("none", "optimizer", "params"):
            raise ValueError(f"offload: expected 'none', 'optimizer' or 'params', got "
                             f"{self.offload!r}")
        if self.vp > 1 and self.pp < 2:
            raise ValueError(f"vp = {self.vp} virtual stages need a pipeline (pp >= 2)")

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp
