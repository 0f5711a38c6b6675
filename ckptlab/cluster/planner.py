"""Choose a training run's layout by modeled step time: every layout of the GPUs that the batch
divides, for each the recompute that fits the GPU's memory (ckptlab.cluster.step_memory) with
the shortest step (ckptlab.cluster.step_time). Every number is *modeled*.

    chosen, rows = plan(model, gpus=1024, gpu="a100", memory=80 * 2**30, batch=1536)

The layouts (Megatron-LM's ranks: tensor fastest, then data, then pipeline):
  t   tensor parallel, a power of two within one node that divides the heads and the hidden size
      (the vocabulary is padded to a multiple of 128 t, as Megatron's
      --make-vocab-size-divisible-by does), with sequence parallelism or without;
  p   pipeline stages, a divisor of GPUs / t, at most L: the layers split evenly when p
      divides them, else unevenly as torchtitan splits them (ckptlab.cluster.pipeline.
      split_layers: the first and last stages lighter by the embedding and the head). The
      grid stays small because p must divide GPUs / t (a power of two has log2 of them), an
      uneven p runs one chunk a stage (interleaving needs p v to divide L), and the search's
      lower bound skips what cannot win; v virtual stages per GPU (interleaved 1F1B) up to
      MAX_VIRTUAL, when p v divides L and p divides the micro-batches;
  d   data parallel, GPUs / (t p), with ZeRO stage 0-3 (3 = FSDP full shard) when p = 1, stage
      0-1 with a pipeline (DeepSpeed's pipeline engine refuses ZeRO-2 and -3: its assertion
      "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism");
  b   the micro-batch, a power of two up to MAX_MICRO_BATCH dividing B / d (or the one asked for),
      m = B / (d b) micro-batches a step.
For each, the recompute: per layer none, FlashAttention's or Korthikanti's selective, with the
fewest layers of each chunk recomputed whole that fit; the fastest of the three by step_time.
The plan is the fastest fitting option of all; the runner-up the fastest with another layout.
What the software of a run has can be narrowed: bases (the recompute choices), sequence
parallelism off, the ZeRO stages allowed (Megatron-LM of 2021-22: stage 0 only), whole-layer
recompute of every layer of a chunk or none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ckptlab.cluster import pipeline, step_time
from ckptlab.cluster import step_memory as sm
from ckptlab.cluster import zero3 as zero3_impl
from ckptlab.cluster import zero_offload as offloading
from ckptlab.measure import roofline

BASES = ("none", "flash", "selective")
ZERO_STAGES = (0, 1, 2, 3)
VOCAB_MULTIPLE = 128  # Megatron-LM pads the vocabulary to a multiple of 128 x t
MAX_VIRTUAL = 4  # virtual stages tried (Korthikanti et al. 2022 run v = 3)
MAX_MICRO_BATCH = 16
# What the planner accepts: the search tries every layout (some thousands at GPT-3 scale) in
# seconds, and byte counts stay exact in float64 (< 2^53). The largest published GPTs are well
# inside (1T parameters: 128 layers, hidden 25600, 3072 GPUs; Narayanan et al. 2021, Table 1).
LIMITS = dict(layers=4096, hidden=1 << 17, heads=1 << 12, seq=1 << 20, vocab=1 << 22,
              gpus=1 << 20, batch=1 << 24, micro_batch=1 << 12)


def check_limits(model: sm.GPTShape, gpus: int, batch: int | None = None,
                 micro_batch: int | None = None) -> None:
    """ValueError (one line) for a size past LIMITS or a head dimension the attention time
    model has no kernel for, before any search."""
    values = dict(layers=model.layers, hidden=model.hidden, heads=model.heads, seq=model.seq,
                  vocab=model.vocab, gpus=gpus, batch=batch, micro_batch=micro_batch)
    for name, x in values.items():
        if x is None:
            continue
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ValueError(f"{name}: expected a positive int, got {x!r}")
        if x > LIMITS[name]:
            raise ValueError(f"{name} = {x} is more than the planner models (at most "
                             f"{LIMITS[name]:,})")
    d = model.hidden // model.heads
    if d % 8 or not 8 <= d <= 256:
        raise ValueError(f"head dim h / a = {d}: the attention time model (the lab's kernels, "
                         "like FlashAttention's) needs a multiple of 8 in [8, 256]")


PRUNED = "pruned, slower than the best by a lower bound: "  # a row's reason: never evaluated


def is_pruned(reason) -> bool:
    """Whether a row's reason says the layout was skipped as slower, not that it does not fit."""
    return isinstance(reason, str) and reason.startswith(PRUNED)


def check_memory(memory) -> None:
    """ValueError (one line) unless `memory` is a positive, finite number of bytes: a memory
    of NaN, 0 or less would otherwise read as "nothing fits"."""
    if isinstance(memory, bool) or not isinstance(memory, (int, float)) \
            or not math.isfinite(memory) or memory <= 0:
        raise ValueError(f"memory: expected a positive, finite number of bytes, got {memory!r}")


def padded(model: sm.GPTShape, t: int) -> sm.GPTShape:
    """The model with its vocabulary padded to a multiple of 128 t (Megatron-LM)."""
    m = VOCAB_MULTIPLE * t
    return replace(model, vocab=-(-model.vocab // m) * m)


@dataclass(frozen=True)
class Option:
    """One layout with one recompute choice: its modeled peak per GPU and step time."""

    layout: sm.Layout
    base: str  # per layer: none, flash or selective
    full: int  # the first `full` layers of each chunk recomputed whole
    micro_batches: int  # m a step
    memory: sm.StepMemory
    time: step_time.StepTime
    recompute_flops: float  # per GPU per step

    @property
    def peak(self) -> int:
        return self.memory.peak

    @property
    def step_s(self) -> float:
        return self.time.step_s

    def recompute_short(self, layers: int) -> str:
        """keep, flash or selective, "+k full" for whole layers; "full" for every layer."""
        if self.full == chunk_layers(layers, self.layout):
            return "full"
        return {"none": "keep", "flash": "flash", "selective": "selective"}[self.base] + \
            (f" +{self.full} full" if self.full else "")

    def recompute_text(self, layers: int) -> str:
        if self.full == chunk_layers(layers, self.layout):
            return "full (every layer)"
        text = {"none": "nothing", "flash": "S = Q K^T (FlashAttention)",
                "selective": "attention core (selective)"}[self.base]
        where = "" if self.layout.pp == 1 else (" of each stage" if self.layout.vp == 1
                                                 else " of each chunk")
        whole = (f"; the first {self.full} layers{where} whole" if self.full > 1
                 else f"; the first layer{where} whole")
        return text + (whole if self.full else "")


def evaluate(model, layout, m, gpu, memory, recipe="bf16", loss="torch", base="none",
             full=None, dropout=True, achievable=None,
             overlap_dp=True, partial_full: bool = True) -> Option | None:
    """The option with `base` and the fewest whole-layer recomputes that fit (full=None), or
    exactly `full`; None when it does not fit. partial_full=False: a chunk's layers are
    recomputed whole all or none (Megatron-LM before --recompute-method block)."""
    shaped = padded(model, layout.tp)
    kw = dict(recipe=recipe, dropout=dropout, loss=loss, micro_batches=m)
    if full is None:
        full = sm.fewest_full_layers(shaped, layout, memory, recompute=base, **kw)
        if full is None:
            return None
        if full and not partial_full:
            full = chunk_layers(model.layers, layout)
    mem = sm.step_memory(shaped, layout, recompute=base, full_layers=full, **kw)
    if mem.peak > memory:
        return None
    st = step_time.step_time(shaped, layout, gpu, recipe, base, full, m, loss, achievable,
                             overlap_dp, dropout=dropout)
    b = layout.micro_batch
    n = model.stage_layers(layout.pp, mem.stage)  # layers on the fullest stage
    whole = min(full * layout.vp, n)
    rec = whole * model.layer_forward_flops(b) + (n - whole) * model.recompute_flops(b, base)
    return Option(layout, base, full, m, mem, st, m * rec / layout.tp)


def layouts(model, gpus: int, gpu: str, batch: int | None, micro_batch: int | None = None):
    """Yield (Layout, m) for every layout of the module docstring, or (Layout, reason) where
    the batch does not divide."""
    node = step_time.links(gpu)[0]
    t = 1
    while t <= min(node, gpus):
        ok = gpus % t == 0 and model.heads % t == 0 and model.hidden % t == 0 \
            and model.kv_heads % t == 0
        for p in (q for q in range(1, model.layers + 1) if ok and (gpus // t) % q == 0
                  and _splits(model.layers, q)):
            d = gpus // (t * p)
            for sp in ((False, True) if t > 1 else (False,)):
                for zero in (range(4) if d > 1 and p == 1 else range(2) if d > 1 else (0,)):
                    yield from _micro(model, sm.Layout(d, t, sp, zero, 1, p, 1), batch,
                                      micro_batch)
        t *= 2


def _micro(model, base, batch, micro_batch):
    d, p = base.dp, base.pp
    if batch is None:
        b = micro_batch or 1
        yield replace(base, micro_batch=b), 1
        return
    if batch % d:
        yield base, f"batch {batch} is not a multiple of d = {d}"
        return
    per = batch // d
    sizes = [micro_batch] if micro_batch else [x for x in (1 << k for k in range(13))
                                               if x <= min(per, MAX_MICRO_BATCH)]
    found = False
    for b in sizes:
        if per % b:
            continue
        m = per // b
        for v in range(1, MAX_VIRTUAL + 1 if p > 1 else 2):
            if v > 1 and (model.layers % (p * v) or m % p):
                continue
            found = True
            yield replace(base, micro_batch=b, vp=v), m
    if not found:
        yield base, (f"batch {batch} / d = {per} is not a multiple of the micro-batch "
                     f"{micro_batch}")


def best_option(model, layout, m, gpu, memory, recipe="bf16", loss="torch", bases=BASES,
                dropout=True, achievable=None,
                overlap_dp=True, partial_full: bool = True) -> Option | None:
    """The fastest fitting option of `layout` over the recompute bases."""
    best = None
    for base in bases:
        opt = evaluate(model, layout, m, gpu, memory, recipe, loss, base, dropout=dropout,
                       achievable=achievable, overlap_dp=overlap_dp, partial_full=partial_full)
        if opt is not None and (best is None or (opt.step_s, opt.peak) < (best.step_s,
                                                                         best.peak)):
            best = opt
    return best


def lower_bound(model, layout, m, gpu, recipe="bf16",
                achievable=None) -> float:
    """Seconds a step takes at least: the slowest stage's matmuls, over the pipeline's
    m + (p - 1) / v micro-batch times (step_time without attention, communication, recompute,
    element-wise kernels or the optimizer)."""
    b, t = layout.micro_batch, layout.tp
    dtype = "fp32" if sm.recipe_of(recipe).name == "fp32" else "bf16"
    fraction = step_time.efficiency(model, layout, gpu, achievable)
    peak = fraction * roofline.peak_flops(step_time._spec(gpu), dtype)
    counts = pipeline.split_layers(model.layers, layout.pp)
    layer = 3 * model.layer_matmul_flops(b) / t
    head = 3 * padded(model, t).head_flops(b) / t
    mb = max(max(counts) * layer, counts[-1] * layer + head) / peak
    return pipeline.step_units(layout.pp, m, layout.vp) * mb


def why_not(model, layout, m, recipe="bf16", loss="torch", dropout=True) -> str:
    """Why nothing fits: the peak with every layer recomputed, and its largest term."""
    least = sm.step_memory(padded(model, layout.tp), layout, recipe, "full", dropout=dropout,
                           loss=loss, micro_batches=m)
    term = max(least.terms.items(), key=lambda kv: kv[1])
    return (f"needs {least.peak / 2**30:.1f} GiB even with full recompute; largest term "
            f"{term[0]} {term[1] / 2**30:.1f} GiB")


def plan(model, gpus: int, gpu: str, memory: float, batch: int | None = None,
         micro_batch: int | None = None, recipe: str = "bf16", loss: str = "torch",
         dropout: bool = True, achievable=None,
         overlap_dp: bool = True, bases=BASES, sequence_parallel: bool = True,
         zero_stages=ZERO_STAGES, partial_full: bool = True, zero3: str = "fsdp",
         offload="none", host_memory: float = offloading.HOST_MEMORY) -> tuple:
    """(the fastest fitting Option or None, rows): rows are (Layout, Option or the reason
    nothing of that layout fits), one per layout tried; bases, sequence_parallel=False,
    zero_stages and partial_full=False (evaluate) leave out what a run's software did not
    have; zero3 the ZeRO-3 implementation ("fsdp" or "deepspeed": ckptlab.cluster.zero3).
    offload: the model states kept in host memory of `host_memory` bytes a GPU
    (ckptlab.cluster.zero_offload): "none", "optimizer", "params", or "auto": none where
    anything fits without, else both offloads weighed (rows: those of both searches)."""
    if offload == "auto":
        kw = dict(batch=batch, micro_batch=micro_batch, recipe=recipe, loss=loss,
                  dropout=dropout, achievable=achievable, overlap_dp=overlap_dp, bases=bases,
                  sequence_parallel=sequence_parallel, zero_stages=zero_stages,
                  partial_full=partial_full, zero3=zero3, host_memory=host_memory)
        chosen, rows = plan(model, gpus, gpu, memory, **kw)
        if chosen is not None:
            return chosen, rows
        chosen, more = plan(model, gpus, gpu, memory, offload=("optimizer", "params"), **kw)
        return chosen, rows + more
    modes = (offload,) if isinstance(offload, str) else tuple(offload)
    for mode in modes:
        offloading.check(mode)
    check_limits(model, gpus, batch, micro_batch)
    check_memory(memory)
    roofline.spec(gpu)
    bad = [b for b in bases if b not in BASES] + [z for z in zero_stages
                                                  if z not in ZERO_STAGES]
    if bad or not bases or not zero_stages:
        raise ValueError(f"bases / zero_stages: expected some of {BASES} and of {ZERO_STAGES}, "
                         f"got {tuple(bases)!r} and {tuple(zero_stages)!r}")
    rows, todo = [], []
    zero3_impl.check(zero3)
    for layout, m in offloading.variants(layouts(model, gpus, gpu, batch, micro_batch), modes,
                                         model, sm.recipe_of(recipe), host_memory):
        if (layout.sp and not sequence_parallel) or layout.zero not in zero_stages:
            continue
        if layout.zero == 3:
            layout = replace(layout, zero3=zero3)
        if isinstance(m, str):
            rows.append((layout, m))
        else:
            todo.append((lower_bound(model, layout, m, gpu, recipe, achievable), layout, m))
    # fastest first; a layout whose matmuls alone take longer than the second-best family's
    # whole step can be neither the plan nor the runner-up: it is not evaluated
    best: dict = {}
    for lb, layout, m in sorted(todo, key=lambda x: x[0]):
        times = sorted(best.values())
        if len(times) >= 2 and lb >= times[1]:
            rows.append((layout, f"{PRUNED}its matmuls alone take {lb:.3g} s, more than "
                                 "the runner-up's whole step"))
            continue
        opt = best_option(model, layout, m, gpu, memory, recipe, loss, bases, dropout,
                          achievable, overlap_dp, partial_full)
        if opt is None:
            rows.append((layout, why_not(model, layout, m, recipe, loss, dropout)))
            continue
        rows.append((layout, opt))
        key = family(layout)
        best[key] = min(best.get(key, float("inf")), opt.step_s)
    fits = [o for _, o in rows if isinstance(o, Option)]
    chosen = min(fits, key=lambda o: (o.step_s, o.peak), default=None)
    return chosen, rows


def family(layout: sm.Layout) -> tuple:
    """What a layout is, apart from its micro-batch and virtual stages."""
    return layout.tp, layout.sp, layout.pp, layout.dp, layout.zero, layout.offload


def check_pipeline(model, layout, m) -> None:
    """The pipeline's constraints, one line each (pipeline.layers_per_chunk and
    check_micro_batches)."""
    chunk_layers(model.layers, layout)
    pipeline.check_micro_batches(m, layout.pp, layout.vp)


def _splits(layers: int, p: int) -> bool:
    """Whether p stages can hold the layers (pipeline.split_layers)."""
    try:
        pipeline.split_layers(layers, p)
    except ValueError:
        return False
    return True


def chunk_layers(layers: int, layout: sm.Layout) -> int:
    """The most layers a chunk holds: L / (p v) with virtual stages, else the largest stage's."""
    if layout.vp > 1:
        return pipeline.layers_per_chunk(layers, layout.pp, layout.vp)
    return max(pipeline.split_layers(layers, layout.pp))
