"""A training step's time on a layout of GPUs, modeled: compute at a fraction of the peak that
grows with the size of the matmuls (ckptlab.cluster.efficiency), attention from the lab's own
time model, the communication each kind of parallelism and each ZeRO stage does over the links
as deployed (ckptlab.cluster.links), and the pipeline's bubble. Every number here is *modeled*.

    st = step_time(GPTShape(96, 12288, 96, 2048, 51200), Layout(dp=16, tp=8, pp=8, sp=True),
                   "A100", recipe="bf16-fp32grad", recompute="selective", micro_batches=12)
    st.step_s, st.terms                              # seconds, and what they are made of

Per micro-batch on one pipeline stage (L / p layers), forward then backward:
  matmuls     QKV, projection and MLP, 24 b s h^2 / t a layer forward, twice that backward, and
              the head 2 b s h V / t forward, twice backward (last stage), at efficiency(...) x
              the GPU's peak for the recipe's dtype (ckptlab.measure.roofline).
  attention   the core (Q K^T, softmax, P V) of a / t heads at head dim h / a. Standard
              attention (recompute none, selective) as training runs launch it
              (ckptlab.measure.unfused_attention: Megatron-LM's and PyTorch's math path, the
              scores, probabilities and their dropout each through HBM, every score computed);
              FlashAttention ("flash") from ckptlab.measure.timemodel, the lab's tiled kernels
              timed causal (masked tiles skipped) at their unique-bytes bound. Both: a launch
              cost, then the roofline, compute at the same fraction. Selective recompute
              reruns the forward launches in the backward.
  recompute   a layer recomputed whole reruns its forward (matmuls, attention, collectives).
  tensor par. Megatron's two all-reduces of the s b h activations a layer forward, two backward
              (Shoeybi et al. 2019, Fig. 4: the f and g operators), and two more for a layer
              recomputed whole; with sequence parallelism all-gathers and reduce-scatters of the
              same bytes (Korthikanti et al. 2022, section 4.2.2). Ring: an all-reduce moves
              2 (t-1)/t of the buffer per GPU, an all-gather or reduce-scatter (t-1)/t, over
              NVLink inside a node. On the critical path (not overlapped). The loss: Megatron's
              fused one all-reduces three s b fp32 vectors; PyTorch's needs the logits gathered.
  pipeline    p2p: the activation forward and its gradient backward across each of the v stage
              boundaries a micro-batch crosses on this GPU (ckptlab.cluster.pipeline.p2p_bytes:
              1/t a GPU, scatter/gather, then an all-gather over NVLink), on the critical
              path. A step runs m + (p - 1) / v micro-batches' time of the slowest stage (the
              bubble: (p - 1) / (v m) of the ideal).
Per step:
  data par.   ZeRO-0 (DDP): an all-reduce of the gradients; ZeRO-1 and Megatron's distributed
              optimizer: a reduce-scatter of the gradients and an all-gather of the updated
              parameters, once a step (the same bytes). ZeRO-2: a reduce-scatter after every
              micro-batch's backward (each rank keeps only its shard: DeepSpeed issue #2252, a
              maintainer), and the all-gather once; ZeRO-3: per micro-batch an all-gather of
              each layer's parameters in the forward, another in the backward, a reduce-scatter
              of its gradients, hidden as far as its implementation's prefetch lets them
              (ckptlab.cluster.zero3: PyTorch FSDP or DeepSpeed). Each collective hierarchical
              over the d ranks t apart (ranks ordered tensor, data, pipeline, as Megatron-LM
              orders them): NVLink among those on one node, the node's shared network adapters
              across nodes (ckptlab.cluster.links). Overlap, stated: a step's gradient
              reduction hides behind the last micro-batch's backward (DDP's buckets, Megatron's
              --overlap-grad-reduce), each ZeRO-2 reduce-scatter behind its micro-batch's
              backward; the rest is exposed. The parameter all-gather after the optimizer is
              exposed.
  optimizer   Adam's update reads and writes the fp32 master weights and both moments, reads the
              gradient and writes the 16-bit weight: (24 + grad + param) bytes a parameter of
              the shard, at the HBM bandwidth.
  offload     (layout.offload) Adam on the CPU in place of the above, gradients down and
              parameters up over PCIe: ckptlab.cluster.zero_offload.
  element-w.  LayerNorm, the bias-GeLU and the bias-dropout-residual adds, memory-bound: their
              bytes (elementwise_bytes) at the HBM bandwidth, the backward twice the forward's.
Left out: the tied embedding's all-reduce between the first and last stages, the data loader,
kernels overlapping, clocks below boost, stragglers, network contention.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from ckptlab.cluster import efficiency as eff
from ckptlab.cluster import links as fabrics
from ckptlab.cluster import pipeline, zero3, zero_offload
from ckptlab.cluster import step_memory as sm
from ckptlab.cluster.gpt_layer import elementwise_bytes  # noqa: F401 (re-exported)
from ckptlab.measure import roofline, timemodel, unfused_attention

# GPU -> (GPUs a node, bytes/s a GPU reaches inside its node, across nodes while its node's
# GPUs all send): the links as deployed and the fraction of their datasheet rate NCCL reaches
# (ckptlab.cluster.links, each figure with its measurement)
LINKS = {name: (f.node, f.intra, f.inter) for name, f in fabrics.FABRICS.items()}
ATTENTION = {"none": "unfused", "selective": "unfused", "flash": "flash"}  # base -> method


@functools.lru_cache(maxsize=64)
def _spec(gpu: str) -> dict:
    return roofline.spec(gpu)


def links(gpu) -> tuple[int, float, float]:
    """(GPUs a node, achieved bytes/s inside a node, across nodes per GPU) of `gpu`."""
    f = fabric(gpu)
    return f.node, f.intra, f.inter


def fabric(gpu) -> fabrics.Fabric:
    return fabrics.fabric(_spec(gpu)["name"])


def efficiency(model, layout, gpu, achievable=None) -> float:
    """The fraction of the peak the step's matmuls and attention reach: by the per-GPU GEMM
    width (ckptlab.cluster.efficiency) when achievable is None, (e_max, x_half) on that curve,
    or the fraction given."""
    if achievable is None or isinstance(achievable, tuple):
        return eff.fraction(model, layout, gpu, achievable)
    if isinstance(achievable, bool) or not isinstance(achievable, (int, float)) \
            or not 0 < achievable <= 1:
        raise ValueError(f"achievable: expected a fraction in (0, 1], got {achievable!r}")
    return float(achievable)


@functools.lru_cache(maxsize=4096)
def attention_s(method: str, b: int, heads: int, s: int, d: int, gpu: str, dtype: str,
                achievable: float, dropout: bool = True) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's attention core on one GPU (its `heads`):
    "unfused" (standard attention, every score, dropout as asked) by unfused_attention,
    "flash" (causal, the lab's kernels) by timemodel's unique-bytes bound, without dropout (one
    regenerated from a seed inside the kernel adds no HBM bytes; its random numbers are left
    out)."""
    if method == "unfused":
        return unfused_attention.seconds(b, heads, s, d, gpu, dtype, achievable, dropout)
    mt = timemodel.method_time(method, b, heads, s, s, d, gpu, causal=method == "flash",
                               dtype=dtype, achievable=achievable)
    fwd = sum(x.seconds for x in mt.launches["unique"] if "bwd" not in x.kernel)
    return fwd, mt.lower - fwd


@dataclass
class StepTime:
    """Seconds of one step and its parts (all modeled). terms: the step's critical path."""

    terms: dict = field(default_factory=dict)
    micro_batch_s: float = 0.0  # the slowest stage's forward + backward of one micro-batch
    stage: int = 0
    parts: dict = field(default_factory=dict)  # per micro-batch on that stage, by kind
    dp_bytes: float = 0.0  # bytes a GPU sends for data parallelism in a step

    @property
    def step_s(self) -> float:
        return sum(self.terms.values())


def _ring(n: int) -> float:
    return (n - 1) / n


def stage_parts(model, layout, gpu, rec, base, k, loss, stage, achievable,
                dropout: bool = True) -> dict:
    """Per micro-batch on pipeline stage `stage`: seconds forward and backward by kind."""
    s, b, h, a = model.seq, layout.micro_batch, model.hidden, model.heads
    t, p, v = layout.tp, layout.pp, layout.vp
    dtype = "fp32" if rec.name == "fp32" else "bf16"
    spec = _spec(gpu)
    peak = achievable * roofline.peak_flops(spec, dtype)
    node, intra, inter = links(gpu)
    n_layers = model.stage_layers(p, stage)
    full = min(k, n_layers // v) * v  # layers of this stage recomputed whole
    w = rec.activation
    lin = model.layer_matmul_flops(b) / t / peak  # one layer's forward matmuls (GPT 24 b s h^2)
    af, ab = attention_s(ATTENTION[base], b, a // t, s, h // a, spec["name"], dtype,
                         achievable, dropout)
    coll = 2 * _ring(t) * s * b * h * w / intra  # one all-reduce (or its SP pair) of s b h
    hbm = spec["hbm_bytes_per_s"]
    ew = model.elementwise_bytes(b, t, layout.sp, w, dropout) / hbm  # one layer's forward
    out = dict(matmul_f=n_layers * lin, matmul_b=2 * n_layers * lin,
               attention_f=n_layers * af, attention_b=n_layers * ab,
               elementwise_f=n_layers * ew, elementwise_b=2 * n_layers * ew,
               tp_f=2 * n_layers * coll, tp_b=2 * n_layers * coll,
               recompute=full * (lin + af + ew + 2 * coll), p2p=0.0)
    if base == "selective":
        out["recompute"] += (n_layers - full) * af  # the attention core's forward, again
    if stage == p - 1:  # the head: logits forward, dX and dW backward; the loss's collectives
        out["matmul_f"] += model.head_flops(b) / t / peak
        out["matmul_b"] += 2 * model.head_flops(b) / t / peak
        if t > 1:
            out["tp_f"] += (3 * 2 * _ring(t) * 4 * s * b if loss == "fused"
                            else _ring(t) * s * b * model.vocab * w) / intra
    if p > 1:  # per chunk one transfer forward, one backward (Megatron pairs a send with the
        # opposite receive: send_forward_recv_backward), on the slowest link of the pipeline
        link = inter if layout.gpus > node else intra
        share = pipeline.p2p_bytes(s, b, h, t, True, w)  # scatter/gather: 1/t each
        out["p2p"] = v * 2 * (share / link + _ring(t) * s * b * h * w / intra)
    return out


def _dp(model, layout, gpu, rec, stage, m, backward_s, forward_s,
        overlap: bool = True) -> tuple[float, float, float]:
    """(exposed seconds, all-gather seconds after the optimizer, bytes) of data parallelism;
    overlap=False: nothing hides behind compute. Collectives over the d ranks t apart,
    hierarchical (ckptlab.cluster.links)."""
    d, z = layout.dp, layout.zero
    if d == 1:
        return 0.0, 0.0, 0.0
    if not overlap:
        backward_s = forward_s = 0.0
    f = fabric(gpu)

    def coll(kind, nbytes):
        return fabrics.collective_s(f, kind, nbytes, d, layout.tp)

    psi = model.stage_params(layout.tp, layout.pp, stage)
    G, P = psi * rec.grad, psi * rec.param  # the stage's gradients, parameters: bytes
    g, p = G * _ring(d), P * _ring(d)  # what one reduce-scatter / all-gather sends a GPU
    if z <= 1:
        reduce = coll("all-reduce" if z == 0 else "reduce-scatter", G)
        return max(0.0, reduce - backward_s), (coll("all-gather", P) if z == 1 else 0.0), \
            (2 * g if z == 0 else g + p)
    if z == 2:
        return m * max(0.0, coll("reduce-scatter", G) - backward_s), coll("all-gather", P), \
            m * g + p
    n = model.layers // layout.pp
    unit = model.layer_params(layout.tp)
    root = max(0, psi - n * unit)
    exposed = zero3.exposed_s(layout.zero3, n, unit, coll("all-gather", unit * rec.param),
                              coll("reduce-scatter", unit * rec.grad),
                              coll("all-gather", root * rec.param),
                              coll("reduce-scatter", root * rec.grad), forward_s, backward_s)
    return m * exposed, 0.0, m * (2 * p - root * rec.param * _ring(d) + g)


def step_time(model: sm.GPTShape, layout: sm.Layout, gpu, recipe="bf16",
              recompute: str = "none", full_layers: int = 0, micro_batches: int = 1,
              loss: str = "torch", achievable=None,
              overlap_dp: bool = True, dropout: bool = True, delayed: bool = False) -> StepTime:
    """The modeled seconds of a step of m = micro_batches micro-batches (each
    layout.micro_batch sequences) on every pipeline; recompute as step_memory's (its per-layer
    choice, with the first full_layers of each chunk recomputed whole). overlap_dp=False: the
    data-parallel traffic waits for the backward to end (Megatron-LM until 2023: its local DDP
    all-reduced the gradients after the last micro-batch), else it hides as the module says.
    dropout: whether the layers apply it (step_memory's; standard attention's dropout launches
    and the residual adds' masks). With layout.offload the optimizer runs on the CPU and the
    transfers over PCIe add what does not hide (ckptlab.cluster.zero_offload); delayed: its
    one-step delayed parameter update."""
    rec = sm.recipe_of(recipe)
    sm._check(model, layout, rec, recompute, "adam", loss, micro_batches)
    achievable = efficiency(model, layout, gpu, achievable)
    dropout = dropout and model.dropout_layers
    n = sm.most_chunk_layers(model, layout)
    k = sm._full_layers(full_layers, n, recompute)
    base = "none" if recompute == "full" else recompute
    links(gpu)
    m, p, v = micro_batches, layout.pp, layout.vp
    best = None
    for stage in pipeline.distinct_stages(model.layers, p, v):  # the slowest sets the pace
        parts = stage_parts(model, layout, gpu, rec, base, k, loss, stage, achievable, dropout)
        total = sum(parts.values())
        if best is None or total > best[1]:
            best = (stage, total, parts)
    stage, mb, parts = best
    fwd = parts["matmul_f"] + parts["attention_f"] + parts["elementwise_f"] + parts["tp_f"]
    bwd = mb - fwd
    dp_exposed, gather, dp_bytes = _dp(model, layout, gpu, rec, stage, m, bwd, fwd, overlap_dp)
    node, intra, inter = links(gpu)
    psi = model.stage_params(layout.tp, p, stage)
    shard = psi // layout.dp if layout.zero >= 1 else psi
    hbm = _spec(gpu)["hbm_bytes_per_s"]
    st = StepTime(stage=stage, micro_batch_s=mb, parts=parts, dp_bytes=dp_bytes)
    ideal = {key: m * val for key, val in parts.items()}
    st.terms = dict(ideal, bubble=(pipeline.step_units(p, m, v) - m) * mb,
                    dp_exposed=dp_exposed + gather,
                    optimizer=shard * (24 + rec.grad + rec.param) / hbm)
    if layout.offload != "none":  # Adam on the CPU, the transfers over PCIe
        st.terms["optimizer"] = 0.0
        st.terms.update(zero_offload.time_terms(model, layout, rec, _spec(gpu)["name"], m, fwd,
                                                bwd, delayed, min(node, layout.gpus)))
    return st


def model_flops(model: sm.Shape, batch: int) -> float:
    """Model FLOPs of a step of `batch` sequences (the shape's step_flops): for a GPT
    72 B L s h^2 (1 + s/(6h) + V/(12 h L)) (Korthikanti et al. 2022, Eq. 7;
    ckptlab.cluster.at_scale.step_flops); for a Llama its matmuls' 6 N-style count with the
    attention core's 12 s^2 h a layer."""
    return float(model.step_flops(batch))


def narayanan_flops(model: sm.GPTShape, batch: int) -> float:
    """The FLOPs Narayanan et al. 2021 count a step with full recompute (their Eq. 3):
    96 B s L h^2 (1 + s/(6h) + V/(16 L h))."""
    s, L, h, V = model.seq, model.layers, model.hidden, model.vocab
    return 96 * batch * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
