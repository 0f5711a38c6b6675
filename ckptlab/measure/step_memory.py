"""A training step's memory per GPU, on paper: parameters, gradients, optimizer state,
activations and the largest transient, for data, tensor and sequence parallelism and ZeRO /
FSDP sharding, in the bytes of a precision recipe. Every number here is *modeled*.

    m = step_memory(GPTShape(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200),
                    Layout(dp=128, tp=8, sp=True, zero=3), "bf16", recompute="selective")
    m.peak, m.terms                                  # bytes per GPU, and what they are made of

Terms and their sources (Psi: parameters held by one tensor-parallel rank, before ZeRO):
  params      Psi x recipe.param bytes; / dp with ZeRO stage 3 (= FSDP FULL_SHARD: Rajbhandari
              et al. 2020, "ZeRO", section 5: P_os+g+p; PyTorch's fully_shard docs).
  grads       Psi x recipe.grad bytes; / dp from stage 2 (ZeRO P_os+g).
  optimizer   Psi x (master + optimizer state) bytes; / dp from stage 1 (ZeRO P_os). ZeRO's mixed
              precision Adam: fp16 parameter 2 + gradient 2 + fp32 master, momentum, variance
              12 = 16 bytes a parameter ("K = 12", section 3.1); "bf16" here is that recipe.
              fp32 Adam: 4 + 4 + 8 = 16 too, with no master copy.
  activations per layer, Korthikanti et al. 2022 (ckptlab.measure.at_scale, Table 2) for the
              recompute choice, tensor and sequence parallelism, at the recipe's activation
              bytes; `dropout=False` drops their dropout masks and outputs (2 s b h + 3 a s^2 b
              of their 34 s b h + 5 a s^2 b), `ln_stats` adds what they leave out: each
              LayerNorm's fp32 mean and rstd (2 x 2 x 4 s b per layer). Plus the embedding's
              token and position ids (int64) and the head: its LayerNorm input and output, the
              fp32 log-softmax of the logits (s b V / t values) and the int64 targets.
              A recompute holds, while one layer is recomputed, what it dropped for that layer
              (full: the layer's whole activations; selective: its attention core): after the
              head's backward, so the step holds the larger of the two.
  transient   the most a step holds briefly beyond the above: with ZeRO-3 / FSDP, an
              all-gathered unit (one layer's parameters) and the one prefetched after it
              (fully_shard's implicit prefetch: the next unit's all-gather overlaps this one's
              compute), plus the unit's unsharded gradients before their reduce-scatter; the
              gradient of the logits (fp32, s b V / t) in the head's backward.
  peak        params + grads + optimizer + activations + transient: an upper bound (the full
              gradients and the full activations are not both alive at one moment).
Left out: the allocator's fragmentation and caching, communication buffers other than the
gathered units, the CUDA context and kernels' workspaces (~0.5-1 GB a GPU on real systems).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ckptlab.measure import at_scale

RECOMPUTE = at_scale.RECOMPUTE


@dataclass(frozen=True)
class Recipe:
    """Bytes per parameter (param, grad, master copy, optimizer state) and per activation."""

    name: str
    param: int
    grad: int
    master: int
    optimizer: int
    activation: int


RECIPES = {
    # fp32 everywhere; Adam's momentum and variance in fp32 (torch.optim.Adam's state)
    "fp32": Recipe("fp32", 4, 4, 0, 8, 4),
    # ZeRO's mixed-precision Adam (section 3.1): 16-bit weights and gradients, fp32 master
    # weights, momentum and variance: 2 + 2 + 12 = 16 bytes a parameter
    "bf16": Recipe("bf16", 2, 2, 4, 8, 2),
}
OPTIMIZER_BYTES = {"adam": 8, "sgd": 0, "momentum": 4}  # fp32 state per parameter


@dataclass(frozen=True)
class GPTShape:
    """A GPT-2 style transformer: L layers of hidden h, a heads, 4h MLP, learned positions."""

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    tied: bool = True  # the head shares the token embedding (GPT-2, GPT-3)

    def layer_params(self, t: int = 1) -> int:
        """One layer's parameters on one of t tensor-parallel ranks (Megatron's split: QKV and
        fc by columns with their biases, out and proj by rows; the row-split biases and the
        LayerNorms replicated): (12 h^2 + 7 h) / t + 6 h; t = 1: 12 h^2 + 13 h."""
        h = self.hidden
        return (12 * h * h + 7 * h) // t + 6 * h

    def params(self, t: int = 1) -> int:
        """All parameters on one tensor-parallel rank: layers, vocab-parallel token embedding,
        positions and the final LayerNorm (replicated), an untied head split by vocabulary."""
        h, V = self.hidden, self.vocab
        head = 0 if self.tied else V * h // t
        return self.layers * self.layer_params(t) + V * h // t + self.seq * h + 2 * h + head


@dataclass(frozen=True)
class Layout:
    """Parallel degrees: dp data-parallel ranks (ZeRO shards over them), tp tensor-parallel,
    sp sequence parallelism (within tp), zero stage 0-3 (3 = FSDP full shard), micro-batch."""

    dp: int = 1
    tp: int = 1
    sp: bool = False
    zero: int = 0
    micro_batch: int = 1

    @property
    def gpus(self) -> int:
        return self.dp * self.tp


@dataclass
class StepMemory:
    terms: dict = field(default_factory=dict)  # name -> bytes per GPU
    transients: dict = field(default_factory=dict)

    @property
    def peak(self) -> int:
        return sum(self.terms.values()) + max(self.transients.values(), default=0)


def _positive(name, x) -> None:
    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
        raise ValueError(f"{name}: expected a positive int, got {x!r}")


def model_states(psi: int, recipe="bf16", dp: int = 1, zero: int = 0,
                 optimizer: str = "adam") -> dict:
    """{params, grads, optimizer}: bytes per GPU of psi parameters' model states, sharded over
    dp data-parallel ranks from ZeRO stage 3, 2, 1 respectively (ZeRO, Figure 1)."""
    rec = RECIPES[recipe] if isinstance(recipe, str) and recipe in RECIPES else recipe
    if not isinstance(rec, Recipe):
        raise ValueError(f"recipe: expected one of {sorted(RECIPES)} or a Recipe, got {recipe!r}")
    if optimizer not in OPTIMIZER_BYTES:
        raise ValueError(f"optimizer: expected one of {sorted(OPTIMIZER_BYTES)}, got "
                         f"{optimizer!r}")
    _positive("dp", dp)
    if zero not in (0, 1, 2, 3):
        raise ValueError(f"zero: expected a ZeRO stage 0, 1, 2 or 3, got {zero!r}")
    state = rec.optimizer if optimizer == "adam" else OPTIMIZER_BYTES[optimizer]
    shard = [dp if zero >= k else 1 for k in (3, 2, 1)]
    return dict(params=-(-psi * rec.param // shard[0]), grads=-(-psi * rec.grad // shard[1]),
                optimizer=-(-psi * (rec.master + state) // shard[2]))


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


def step_memory(model: GPTShape, layout: Layout, recipe="bf16", recompute: str = "none",
                optimizer: str = "adam", dropout: bool = True, ln_stats: bool = False,
                full_layers: int = 0) -> StepMemory:
    """Per-GPU bytes of a training step, term by term (see the module's docstring).
    full_layers: the first k layers recompute fully (Megatron's block method), the others as
    `recompute` says."""
    rec = RECIPES[recipe] if isinstance(recipe, str) and recipe in RECIPES else recipe
    for name in ("tp", "micro_batch"):
        _positive(name, getattr(layout, name))
    s, b, h, a, V = model.seq, layout.micro_batch, model.hidden, model.heads, model.vocab
    t, dp = layout.tp, layout.dp
    if h % t or V % t:
        raise ValueError(f"tp = {t} must divide the hidden size {h} and the vocabulary {V}")
    m = StepMemory()
    m.terms.update(model_states(model.params(t), rec, dp, layout.zero, optimizer))
    kw = dict(t=t, sp=layout.sp, bytes_per_value=rec.activation)
    one = layer_activations(s, b, h, a, recompute, dropout=dropout, ln_stats=ln_stats, **kw)
    whole = layer_activations(s, b, h, a, "none", dropout=dropout, ln_stats=ln_stats, **kw)
    rep = t if layout.sp else 1
    embed = 8 * s * b + 8 * s  # int64 token ids and position ids (the embeddings' backward)
    head = (2 * rec.activation * s * b * h // rep + (8 * s * b // rep if ln_stats else 0)
            + 4 * s * b * V // t + 8 * s * b + 4)  # + the loss's fp32 total weight
    k, L = full_layers, model.layers
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= L:
        raise ValueError(f"full_layers: expected an int in [0, {L}], got {k!r}")
    if recompute == "full":
        k = L
    inp = layer_activations(s, b, h, a, "full", **kw)
    # a recompute (full: the whole layer, its input among them; selective: the attention
    # core) happens in a layer's backward, after the head's and the later layers' backward
    # released theirs: the last kept layer's while the fully recomputed ones still hold their
    # inputs, the last fully recomputed layer's when only the earlier inputs are left
    last = [head]
    if k < L:
        last.append(whole - one)
    if k > 0:
        last.append(whole - inp - (L - k) * one)
    m.terms["activations"] = embed + k * inp + (L - k) * one + max(last)
    if layout.zero == 3:
        unit = model.layer_params(t)
        m.transients["fsdp units"] = unit * (2 * rec.param + rec.grad)
    m.transients["logits grad"] = 4 * s * b * V // t
    return m


def nets_gpt(layers: int, width: int, heads: int, seq: int, vocab: int) -> GPTShape:
    """The shape of ckptlab.torch.nets.GPT (untied head without bias)."""
    return GPTShape(layers, width, heads, seq, vocab, tied=False)


def compare(predicted: dict, measured: dict, explained: dict | None = None) -> list[dict]:
    """Rows term / predicted / measured / relative difference / why, for the terms in both."""
    explained = explained or {}
    rows = []
    for k in predicted:
        if k in measured:
            p, q = predicted[k], measured[k]
            rows.append(dict(term=k, predicted=p, measured=q,
                             rel=(p - q) / q if q else float(p != q), why=explained.get(k, "")))
    return rows
