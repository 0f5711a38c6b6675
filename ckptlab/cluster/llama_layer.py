"""The Llama layer on paper (LlamaShape): grouped-query attention with rotary positions, a
SwiGLU MLP, RMSNorm, no biases, untied input and output embeddings. What the step models ask of
a layer, for it: parameters, FLOPs, the bytes it keeps for its backward, element-wise bytes.

    LlamaShape(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, seq=8192,
               vocab=128256)                          # Llama 3 8B

The layer (Touvron et al. 2023; Meta's Llama 3 paper, 2024, Table 3; torchtitan's
models/llama3/model.py), hidden h, a query heads of d = h / a, g key/value heads, MLP width f:
    x + wo(attention(rope(wq n), rope(wk n), wv n)),  n = rmsnorm(x)
    x + w2(silu(w1 n) * w3 n),                        n = rmsnorm(x)
Parameters: wq, wo h x h; wk, wv h x g d; w1, w3, w2 h x f; two RMSNorm weights h. With
tensor parallelism over t (Megatron's split: wq, wk, wv, w1, w3 by columns, wo, w2 by rows; the
norms replicated) t must divide the g key/value heads, as Megatron-LM asks of its query groups.

Saved for the backward, per layer, w bytes a value (Korthikanti et al. 2022's accounting, with
what PyTorch saves, measured by ckptlab.torch.llama_bytes): each RMSNorm's input (and its
fp32 rstd, 4 s b, counted with ln_stats, like LayerNorm's statistics) and output (the next
matmuls' input), 4 s b h, replicated across t and split by sequence parallelism; split over t:
Q and O (2 s b h), K and V (2 s b g d), and the SwiGLU's w1 output (SiLU's input), SiLU's
output, w3's output and the product (w2's input): 4 s b f. RoPE saves no activation: its
multiplications keep only the cos and sin tables, the model's constants (8 s d bytes once,
fp32, counted on every stage). The attention core as the GPT's: the probabilities (w a s^2 b)
with standard attention, FlashAttention's fp32 logsumexp (4 a s b) instead, or nothing
(selective). No dropout. Full recompute keeps the layer's input (s b h, / t with SP).

Its time (ckptlab.cluster.step_time) takes the matmuls' FLOPs from the weights above, the
element-wise kernels' bytes from elementwise_bytes, and the attention core as the GPT's over
the a query heads: a grouped-query kernel reads K and V once per group, fewer bytes than that.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptlab.cluster.model_shape import Shape, _positive


@dataclass(frozen=True)
class LlamaShape(Shape):
    """A Llama-family transformer: L layers of hidden h, a query heads, kv_heads key/value
    heads (grouped-query attention), a SwiGLU MLP of width ffn, rotary positions, RMSNorm."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    seq: int
    vocab: int
    tied: bool = False  # Llama 3 8B and up: the output projection is its own matrix

    dropout_layers = False
    norm_stats = 4  # bytes a token of one RMSNorm's fp32 rstd

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "kv_heads", "ffn", "seq", "vocab"):
            _positive(name, getattr(self, name))
        if self.hidden % self.heads:
            raise ValueError(f"heads = {self.heads} must divide the hidden size {self.hidden}")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads = {self.kv_heads} must divide the {self.heads} heads "
                             "(grouped-query attention)")
        if not isinstance(self.tied, bool):
            raise ValueError(f"tied: expected True or False, got {self.tied!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def _matrices(self) -> int:
        """Weights of one layer's matmuls: wq, wo h^2 each; wk, wv h g d; w1, w2, w3 h f."""
        h = self.hidden
        return 2 * h * h + 2 * h * self.kv_heads * self.head_dim + 3 * h * self.ffn

    def layer_params(self, t: int = 1) -> int:
        """One layer's parameters on one of t tensor-parallel ranks: the matrices / t and the
        two RMSNorm weights (replicated)."""
        return self._matrices() // t + 2 * self.hidden

    def stage_params(self, t: int, p: int, stage: int) -> int:
        """Parameters on one GPU of stage `stage` of p: its layers; the token embedding on
        stage 0; the final RMSNorm and the output projection on stage p - 1 (vocabulary-
        parallel; a tied one is the embedding when p = 1, a copy when p > 1)."""
        h, V = self.hidden, self.vocab
        psi = self.stage_layers(p, stage) * self.layer_params(t)
        if stage == 0:
            psi += V * h // t
        if stage == p - 1:
            psi += h + (V * h // t if not self.tied or p > 1 else 0)
        return psi

    def layer_matmul_flops(self, b: int) -> int:
        """The layer's matmuls outside the attention core, forward: 2 b s x its weights."""
        return 2 * b * self.seq * self._matrices()

    def tp_problem(self, t: int) -> str | None:
        if self.kv_heads % t:
            return f"tp = {t} must divide the {self.kv_heads} key/value heads"
        return super().tp_problem(t)

    def layer_activations(self, b: int, recompute: str = "none", t: int = 1, sp: bool = False,
                          bytes_per_value: int = 2, dropout: bool = False,
                          ln_stats: bool = False) -> int:
        """Bytes one layer keeps for its backward on each of t GPUs (module docstring);
        `dropout` is ignored (the layer has none)."""
        from ckptlab.cluster.at_scale import RECOMPUTE

        if recompute not in RECOMPUTE:
            raise ValueError(f"recompute: expected one of {RECOMPUTE}, got {recompute!r}")
        s, h, a, w = self.seq, self.hidden, self.heads, bytes_per_value
        rep = t if sp else 1
        if recompute == "full":
            return w * s * b * h // rep
        kv = self.kv_heads * self.head_dim
        held = 4 * w * s * b * h // rep + w * s * b * (2 * h + 2 * kv + 4 * self.ffn) // t
        if recompute == "none":
            held += w * a * s * s * b // t  # the probabilities
        elif recompute == "flash":
            held += 4 * a * s * b // t  # the logsumexp, fp32
        if ln_stats:
            held += 2 * 4 * s * b // rep
        return held

    def embed_saved(self, b: int) -> int:
        """What the embedding saves: the int64 token ids (no learned positions)."""
        return 8 * self.seq * b

    def rope_saved(self) -> int:
        """RoPE's cos and sin tables, fp32 (s, d) each: saved by every layer, one storage."""
        return 8 * self.seq * self.head_dim

    def elementwise_bytes(self, b: int, t: int, sp: bool, w: int, dropout: bool = False) -> int:
        """HBM bytes of one layer's forward outside its matmuls and attention core, each kernel
        reading its inputs and writing its output once: two RMSNorms (read, write) 4 w s b h
        and two residual adds (read two, write one) 6 w s b h, replicated (split with SP);
        RoPE on Q and K (read, write) 2 w s b (h + g d), SiLU (read, write f) and the product
        (read 2 f, write f) 5 w s b f, split over t."""
        s, h = self.seq, self.hidden
        kv = self.kv_heads * self.head_dim
        replicated = 10 * w * s * b * h
        return replicated // (t if sp else 1) + w * s * b * (2 * (h + kv) + 5 * self.ffn) // t

    def describe(self) -> str:
        return (f"Llama L={self.layers} h={self.hidden} a={self.heads} kv={self.kv_heads} "
                f"ffn={self.ffn} s={self.seq} V={self.vocab}")
