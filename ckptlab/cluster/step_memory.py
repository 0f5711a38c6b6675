"""A training step's memory per GPU, on paper: parameters, gradients, optimizer state,
activations and the largest transient, for data, tensor, sequence and pipeline parallelism and
ZeRO / FSDP sharding, in the bytes of a precision recipe. Every number here is *modeled*.

    m = step_memory(GPTShape(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200),
                    Layout(dp=16, tp=8, pp=8, sp=True, zero=1), "bf16-fp32grad",
                    recompute="selective", loss="fused")
    m.peak, m.terms, m.stage                         # bytes on the fullest GPU, by term

The layer is the model's: a GPTShape (Korthikanti's GPT layer) or a LlamaShape
(ckptlab.cluster.llama_layer: grouped-query attention, SwiGLU, RMSNorm, no dropout) answers for
its parameters and the bytes each layer keeps; the stages' layers come from
ckptlab.cluster.pipeline.split_layers (uneven when p does not divide L).

Terms and their sources (Psi: parameters one GPU holds before ZeRO: its pipeline stage's layers
on one of t tensor-parallel ranks, the embeddings on the first stage, the final LayerNorm and
the head on the last; with p > 1 and a tied head the last stage keeps its own copy of the word
embedding, as Megatron-LM does):
  params      Psi x recipe.param bytes; / dp with ZeRO stage 3 (= FSDP FULL_SHARD: Rajbhandari
              et al. 2020, "ZeRO", section 5: P_os+g+p; PyTorch's fully_shard docs).
  grads       Psi x recipe.grad bytes; / dp from stage 2 (ZeRO P_os+g).
  optimizer   Psi x (master + optimizer state) bytes; / dp from stage 1 (ZeRO P_os).
              "bf16": ZeRO's mixed-precision Adam, 16-bit weights and gradients, fp32 master
              weights, momentum and variance: 2 + 2 + 12 = 16 bytes ("K = 12", section 3.1).
              "bf16-fp32grad": Megatron-LM's recipe, gradients accumulated and reduced in fp32
              ("main grads"): 2 + 4 + 12 = 18 bytes; with stage 1 that is Megatron's
              distributed optimizer, 6 + 12 / d (Megatron-Core docs, distrib_optimizer).
              "fp32": 4 + 4 + 8 = 16, with no master copy.
  activations for each micro-batch a stage holds in flight (ckptlab.cluster.pipeline: p - i on
              stage i with 1F1B, more with virtual stages), per layer Korthikanti et al. 2022
              (ckptlab.cluster.at_scale, Table 2) for the recompute choice, tensor and sequence
              parallelism, at the recipe's activation bytes; `dropout=False` drops their
              dropout masks and outputs (2 s b h + 3 a s^2 b of their 34 s b h + 5 a s^2 b),
              `ln_stats` adds what they leave out: each LayerNorm's fp32 mean and rstd
              (2 x 2 x 4 s b per layer). On the first stage the int64 token and position ids
              (and with dropout the embedding dropout's 1-byte mask, s b h / t with SP:
              Korthikanti section 4.3); on the last the head for one micro-batch: its LayerNorm
              input and output, the loss's saved fp32 probabilities and the targets (LOSSES).
              A recompute holds, while one layer is recomputed, what it dropped for that layer
              (full: the layer's whole activations; selective: its attention core;
              FlashAttention's backward only its fp32 dQ accumulator and D): after the head's
              backward, so the step holds the larger of the two.
  transient   the most a step holds briefly beyond the above: with ZeRO-3, by implementation
              (ckptlab.cluster.zero3): PyTorch FSDP an all-gathered unit (one layer's
              parameters) and the one prefetched after it (fully_shard's implicit prefetch),
              plus the unit's unsharded gradients before their reduce-scatter; DeepSpeed a
              layer and its prefetch bucket (at most stage3_max_live_parameters) and its
              gradient reduce bucket; on the last stage the loss's backward buffers (LOSSES).
  offload     with layout.offload (ckptlab.cluster.zero_offload) the GPU keeps, in place of
              the three above, the 16-bit parameters ("optimizer"; with "params" only the unit
              streamed in and its prefetch) and a gradient bucket; the rest is in host memory.
  peak        params + grads + optimizer + activations + transient. With more than one
              micro-batch a step really holds all of it at once (the gradients accumulated so
              far beside the next micro-batch's activations); with one micro-batch the full
              gradients and activations never coexist and the sum overstates by up to the
              gradients. Either way a real peak adds what is left out below.
Left out: the allocator's fragmentation and caching, communication buffers other than the
gathered units (pipeline sends, gradient buckets), the CUDA context and kernels' workspaces
(~0.5-1 GB a GPU on real systems).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from ckptlab.cluster import at_scale, pipeline, zero3, zero_offload
from ckptlab.cluster.gpt_layer import layer_activations  # noqa: F401 (re-exported)
from ckptlab.cluster.llama_layer import LlamaShape  # noqa: F401 (re-exported)
from ckptlab.cluster.model_shape import GPTShape, Layout, Shape, _positive  # noqa: F401

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
    # Megatron-LM's bf16: fp32 main gradients (bf16 forces accumulate_allreduce_grads_in_fp32,
    # megatron/training/arguments.py); 18 bytes, 6 + 12/d with the distributed optimizer
    "bf16-fp32grad": Recipe("bf16-fp32grad", 2, 4, 4, 8, 2),
}
OPTIMIZER_BYTES = {"adam": 8, "sgd": 0, "momentum": 4}  # fp32 state per parameter
# the loss over the logits, what it saves and what its backward allocates (V' = V / t for the
# vocabulary-parallel loss, V for PyTorch's, which needs the logits gathered whole)
LOSSES = {
    # F.cross_entropy: log_softmax saves its fp32 output; the backward's nll_loss_backward and
    # _log_softmax_backward_data each allocate a logits-sized fp32 buffer, alive at once
    "torch": "PyTorch F.cross_entropy: saves the fp32 log-softmax (4 s b V bytes); its backward "
             "holds two more fp32 logits-sized buffers at once (8 s b V)",
    # Megatron's _VocabParallelCrossEntropy: saves exp(logits) in fp32 and writes the gradient
    # into it in place; autograd casts it to the 16-bit logits' dtype for the head's backward
    "fused": "Megatron's fused vocab-parallel cross-entropy: saves fp32 softmax (4 s b V / t), "
             "writes the gradient in place; the 16-bit copy for the head (2 s b V / t) is the "
             "only transient",
}


@dataclass
class StepMemory:
    terms: dict = field(default_factory=dict)  # name -> bytes per GPU
    transients: dict = field(default_factory=dict)
    stage: int = 0  # the pipeline stage these bytes are for
    stages: dict = field(default_factory=dict)  # stage -> its peak (the stages computed)

    @property
    def peak(self) -> int:
        return sum(self.terms.values()) + max(self.transients.values(), default=0)


def recipe_of(recipe) -> Recipe:
    rec = RECIPES[recipe] if isinstance(recipe, str) and recipe in RECIPES else recipe
    if not isinstance(rec, Recipe):
        raise ValueError(f"recipe: expected one of {sorted(RECIPES)} or a Recipe, got {recipe!r}")
    return rec


def model_states(psi: int, recipe="bf16", dp: int = 1, zero: int = 0,
                 optimizer: str = "adam") -> dict:
    """{params, grads, optimizer}: bytes per GPU of psi parameters' model states, sharded over
    dp data-parallel ranks from ZeRO stage 3, 2, 1 respectively (ZeRO, Figure 1)."""
    rec = recipe_of(recipe)
    if isinstance(psi, bool) or not isinstance(psi, int) or psi < 0:
        raise ValueError(f"psi: expected a parameter count, an int >= 0, got {psi!r}")
    if optimizer not in OPTIMIZER_BYTES:
        raise ValueError(f"optimizer: expected one of {sorted(OPTIMIZER_BYTES)}, got "
                         f"{optimizer!r}")
    _positive("dp", dp)
    if isinstance(zero, bool) or zero not in (0, 1, 2, 3):
        raise ValueError(f"zero: expected a ZeRO stage 0, 1, 2 or 3, got {zero!r}")
    state = rec.optimizer if optimizer == "adam" else OPTIMIZER_BYTES[optimizer]
    shard = [dp if zero >= k else 1 for k in (3, 2, 1)]
    return dict(params=-(-psi * rec.param // shard[0]), grads=-(-psi * rec.grad // shard[1]),
                optimizer=-(-psi * (rec.master + state) // shard[2]))


def loss_bytes(loss: str, s: int, b: int, V: int, t: int, w: int) -> tuple[int, int]:
    """(saved, transient) bytes of the loss over s b logits of V classes on one of t ranks,
    w the activations' bytes (LOSSES)."""
    if loss == "torch":
        return 4 * s * b * V + 8 * s * b + 4, 2 * 4 * s * b * V  # + int64 targets, total weight
    if loss == "fused":  # + the target mask (1 byte) and the masked targets (int64)
        return 4 * s * b * V // t + 9 * s * b, (w * s * b * V // t if w < 4 else 0)
    raise ValueError(f"loss: expected one of {sorted(LOSSES)}, got {loss!r}")


@dataclass(frozen=True)
class _Parts:
    """One stage's bytes as functions of k, the layers a chunk recomputes whole."""

    states: dict
    flight: int  # micro-batches x chunks in flight
    n: int  # layers a chunk
    fixed: int  # activations that do not depend on k (embedding ids, masks)
    one: int  # a layer under the base recompute
    whole: int  # a layer keeping everything
    inp: int  # a fully recomputed layer (its input)
    head: int  # the head's activations (last stage; else 0)
    transients: dict
    backward: int  # what a kept layer's backward holds beyond its saved bytes (see _parts)

    def activations(self, k: int) -> int:
        k = min(k, self.n)  # uneven stages: a stage with fewer layers recomputes all it has
        last = [self.head]
        if k < self.n:
            last.append(self.backward)
        if k > 0:
            last.append(self.whole - self.inp - (self.n - k) * self.one)
        return self.fixed + self.flight * (k * self.inp + (self.n - k) * self.one) + max(last)

    def peak(self, k: int) -> int:
        return (sum(self.states.values()) + self.activations(k)
                + max(self.transients.values(), default=0))


@functools.lru_cache(maxsize=1 << 16)  # the planner asks for the same stage many times
def _parts(model: Shape, layout: Layout, rec: Recipe, recompute: str, optimizer: str,
           dropout: bool, ln_stats: bool, loss: str, micro_batches: int, stage: int) -> _Parts:
    s, b, h, a, V = model.seq, layout.micro_batch, model.hidden, model.heads, model.vocab
    t, p, v = layout.tp, layout.pp, layout.vp
    kw = dict(t=t, sp=layout.sp, bytes_per_value=rec.activation, dropout=dropout,
              ln_stats=ln_stats)
    rep = t if layout.sp else 1
    flight = pipeline.in_flight(stage, p, micro_batches, v)
    fixed = model.rope_saved()  # constant tables the layers save (RoPE's), once
    if stage == 0:  # int64 token (and position) ids, the embedding dropout's mask
        fixed += flight[0] * (model.embed_saved(b) + (s * b * h // rep if dropout else 0))
    head, transients = 0, {}
    if stage == p - 1:
        saved, transient = loss_bytes(loss, s, b, V, t, rec.activation)
        head = 2 * rec.activation * s * b * h // rep \
            + (model.norm_stats * s * b // rep if ln_stats else 0) + saved
        transients["loss backward"] = transient
        # the last chunk's micro-batches in flight each keep their head: one with 1F1B (the loss
        # backward follows its forward at once), all of them when the interleaved schedule runs
        # every forward first (m = p); one of them is in `head` below
        fixed += (flight[-1] - 1) * head
    if layout.zero == 3:
        transients["fsdp units" if layout.zero3 == "fsdp" else "zero-3 buckets"] = \
            zero3.transient_bytes(layout.zero3, model.layer_params(t),
                                  model.stage_params(t, p, stage), rec.param, rec.grad)
    one = model.layer_activations(b, recompute, **kw)
    whole = model.layer_activations(b, "none", **kw)
    # a kept layer's backward: selective holds the attention core it recomputes (whole - one);
    # FlashAttention recomputes it tile by tile on chip and holds only its fp32 dQ accumulator
    # and D = rowsum(dO * O) (the lab's kernels and FlashAttention 2's dq_accum, softmax_d)
    backward = 4 * s * b * h // t + 4 * a * s * b // t if recompute == "flash" else whole - one
    states = model_states(model.stage_params(t, p, stage), rec, layout.dp, layout.zero,
                          optimizer) if layout.offload == "none" else \
        zero_offload.gpu_states(model, layout, rec)
    return _Parts(states, sum(flight),
                  pipeline.stage_chunk_layers(model.layers, p, v, stage), fixed, one, whole,
                  model.layer_activations(b, "full", t=t, sp=layout.sp,
                                          bytes_per_value=rec.activation),
                  head, transients, backward)


def _check(model, layout, recipe, recompute, optimizer, loss, micro_batches):
    rec = recipe_of(recipe)
    if not isinstance(model, Shape):
        raise TypeError(f"model: expected a GPTShape or LlamaShape, got {type(model).__name__}")
    if not isinstance(layout, Layout):
        raise TypeError(f"layout: expected a Layout, got {type(layout).__name__}")
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute: expected one of {RECOMPUTE}, got {recompute!r}")
    if optimizer not in OPTIMIZER_BYTES:
        raise ValueError(f"optimizer: expected one of {sorted(OPTIMIZER_BYTES)}, got "
                         f"{optimizer!r}")
    if loss not in LOSSES:
        raise ValueError(f"loss: expected one of {sorted(LOSSES)}, got {loss!r}")
    problem = model.tp_problem(layout.tp) or (zero_offload.problem(layout)
                                               if layout.offload != "none" else None)
    if problem:
        raise ValueError(problem)
    if layout.vp > 1:
        pipeline.layers_per_chunk(model.layers, layout.pp, layout.vp)
    else:
        pipeline.split_layers(model.layers, layout.pp)
    m = micro_batches if micro_batches is not None else 2 * layout.pp
    pipeline.check_micro_batches(m, layout.pp, layout.vp)
    return rec, m


def _full_layers(k, n: int, recompute: str) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= n:
        raise ValueError(f"full_layers: expected an int in [0, {n}] (layers a chunk), got {k!r}")
    return n if recompute == "full" else k


def step_memory(model: Shape, layout: Layout, recipe="bf16", recompute: str = "none",
                optimizer: str = "adam", dropout: bool = True, ln_stats: bool = False,
                full_layers: int = 0, loss: str = "torch", micro_batches: int | None = None,
                stage: int | None = None) -> StepMemory:
    """Per-GPU bytes of a training step, term by term (see the module's docstring), on
    pipeline stage `stage`, or (None) on the fullest one: the first (the most micro-batches in
    flight, the embeddings), the last (the head and the loss), or with uneven stages one between
    that holds more layers (pipeline.distinct_stages); the others hold less. full_layers: the
    first k layers of each chunk recompute fully (Megatron's block method; a stage with fewer
    layers all of its own), the others as `recompute` says. micro_batches: a step's m (default 2 p:
    enough to reach every schedule's peak)."""
    rec, m = _check(model, layout, recipe, recompute, optimizer, loss, micro_batches)
    dropout = dropout and model.dropout_layers
    n = most_chunk_layers(model, layout)
    k = _full_layers(full_layers, n, recompute)
    p = layout.pp
    if stage is not None and (isinstance(stage, bool) or not isinstance(stage, int)
                              or not 0 <= stage < p):
        raise ValueError(f"stage: expected an int in [0, {p - 1}] or None, got {stage!r}")
    candidates = [stage] if stage is not None else \
        pipeline.distinct_stages(model.layers, p, layout.vp)
    out = {}
    for i in candidates:
        parts = _parts(model, layout, rec, recompute, optimizer, dropout, ln_stats, loss, m, i)
        out[i] = StepMemory(dict(parts.states, activations=parts.activations(k)),
                            dict(parts.transients), i)
    worst = max(out.values(), key=lambda x: x.peak)
    worst.stages = {i: x.peak for i, x in out.items()}
    return worst


def most_chunk_layers(model: Shape, layout: Layout) -> int:
    """The most layers a chunk of any stage holds (the range of full_layers)."""
    if layout.vp > 1:
        return pipeline.layers_per_chunk(model.layers, layout.pp, layout.vp)
    return max(pipeline.split_layers(model.layers, layout.pp))


def fewest_full_layers(model: Shape, layout: Layout, memory: float, recipe="bf16",
                       recompute: str = "none", optimizer: str = "adam", dropout: bool = True,
                       ln_stats: bool = False, loss: str = "torch",
                       micro_batches: int | None = None) -> int | None:
    """The smallest k (layers of each chunk recomputed whole) whose peak, on every stage,
    is at most `memory` bytes; None if not even k = all layers fits. The peak is linear in k
    except near k = n, where the last recomputed layer's transient can grow, so the first part
    is solved, the rest scanned."""
    rec, m = _check(model, layout, recipe, recompute, optimizer, loss, micro_batches)
    dropout = dropout and model.dropout_layers
    n = most_chunk_layers(model, layout)
    stages = [_parts(model, layout, rec, recompute, optimizer, dropout, ln_stats, loss, m, i)
              for i in pipeline.distinct_stages(model.layers, layout.pp, layout.vp)]
    ks = [n] if recompute == "full" else range(n + 1)

    def fits(k):
        return all(x.peak(k) <= memory for x in stages)

    if fits(ks[0]):
        return ks[0]
    if recompute == "full":
        return None
    # k* : from here on the recompute transient can exceed the other candidates on a stage
    tail = n
    for x in stages:
        others = max(x.head, x.backward)
        if x.one > 0:
            tail = min(tail, max(1, x.n - max(0, -(-(x.whole - x.inp - others) // x.one))))
    lo, hi = 1, tail  # on [1, tail] each stage's peak falls linearly: binary search
    if lo <= hi and fits(hi):
        while lo < hi:
            mid = (lo + hi) // 2
            if fits(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo
    for k in range(tail + 1, n + 1):
        if fits(k):
            return k
    return None


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
