"""Plan a training run's memory per GPU: `python -m ckptlab plan`

    python -m ckptlab plan --model gpt3-175b --gpu a100 --gpus 1024 --memory-gb 80 --batch 1536
    python -m ckptlab plan --model gpt2-small --gpu 4090 --gpus 1 --memory-gb 24 --micro-batch 16
    python -m ckptlab plan --model gpt:24,1024,16,1024,50257 ...       (layers,hidden,heads,seq,V)
    python -m ckptlab plan --hf-config config.json ...                 (a GPT-2 config.json)
    python -m ckptlab plan --sequential pkg.mod:factory --input-shape 64,512 ...  (measured:
                                                      ckptlab.cli.plan_sequential)

Every layout of the GPUs is tried: tensor parallelism t (a power of two within a node, dividing
the heads), sequence parallelism with it or not, data parallelism d = GPUs / t with ZeRO stage
0-3 (3 = FSDP full shard); and for each, the recompute with the fewest recompute FLOPs whose
modeled peak (ckptlab.measure.step_memory) fits the GPU's memory: none, FlashAttention's (the
attention core never stored, S = Q K^T redone), Korthikanti's selective (the attention core
redone), each with the first k layers recomputed whole (k = L: full recompute). The plan
printed is the one with the least recompute; among equals, the shortest modeled step.

Step time (modeled, a lower bound): matmul FLOPs (ckptlab.measure.at_scale, the head's
6 s b h V included) at the GPU's peak for the recipe's dtype (ckptlab.measure.roofline), plus
tensor-parallel communication (Megatron: 2 all-reduces of s b h activations per layer in the
forward, 2 in the backward, 2 more with full recompute; a ring moves 2 (t-1)/t of a buffer per
GPU) on the critical path, plus data-parallel communication (all-reduce of the gradients, or
with ZeRO-3 two all-gathers of the parameters per micro-batch and a reduce-scatter of the
gradients) where it exceeds the compute it overlaps. Links per direction: LINKS below. Not
modeled: pipeline parallelism, MFU below peak, the vocabulary-parallel loss's all-reduces.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from ckptlab.cli.report import UsageError, positive_int
from ckptlab.measure import at_scale, offload, roofline
from ckptlab.measure import step_memory as sm

GIB = 1024**3
MODELS = {
    # Brown et al. 2020, Table 2.1: 96 layers, d_model 12288, 96 heads, n_ctx 2048; GPT-2's BPE
    "gpt3-175b": sm.GPTShape(96, 12288, 96, 2048, 50257),
    # Radford et al. 2019 (HF "gpt2" config.json: n_layer 12, n_embd 768, n_head 12,
    # n_positions 1024, vocab_size 50257)
    "gpt2-small": sm.GPTShape(12, 768, 12, 1024, 50257),
}
LINKS = {  # GPU -> (GPUs a node, bytes/s per direction within a node, across nodes per GPU)
    # A100 datasheet: NVLink 600 GB/s (both directions); DGX A100 datasheet: 8 GPUs, 8x
    # ConnectX-6 200 Gb/s HDR InfiniBand (one per GPU): 25 GB/s
    "A100-SXM4-80GB": (8, 300e9, 25e9),
    # H100 / H200 datasheets: NVLink 900 GB/s; DGX H100 / H200: 8x ConnectX-7 400 Gb/s NDR
    "H100-SXM5-80GB": (8, 450e9, 50e9),
    "H200-SXM-141GB": (8, 450e9, 50e9),
    # PCIe cards: PCIe 4.0 x16 both ways (ckptlab.measure.offload.LINKS)
    "L4": (8, offload.LINKS["PCIe 4.0 x16"], offload.LINKS["PCIe 4.0 x16"]),
    "RTX-4090": (1, offload.LINKS["PCIe 4.0 x16"], offload.LINKS["PCIe 4.0 x16"]),
}
BASES = ("none", "flash", "selective")
# Megatron-LM pads the vocabulary to a multiple of 128 x t (--make-vocab-size-divisible-by)
VOCAB_MULTIPLE = 128


@dataclass(frozen=True)
class Option:
    layout: sm.Layout
    base: str  # per layer: none, flash or selective
    full: int  # the first `full` layers recomputed whole
    peak: int
    terms: dict
    transient: tuple  # (name, bytes) of the largest
    recompute_flops: float  # per GPU per step
    compute_s: float
    tp_comm_s: float
    dp_comm_s: float

    @property
    def step_s(self) -> float:
        return self.compute_s + self.tp_comm_s + max(0.0, self.dp_comm_s - self.compute_s)

    def recompute_text(self, layers: int) -> str:
        if self.full == layers:
            return "full (every layer)"
        text = {"none": "nothing", "flash": "S = Q K^T (FlashAttention)",
                "selective": "attention core (selective)"}[self.base]
        whole = f"; the first {self.full} layers whole" if self.full > 1 else "; layer 0 whole"
        return text + (whole if self.full else "")


def padded(model: sm.GPTShape, t: int) -> sm.GPTShape:
    m = VOCAB_MULTIPLE * t
    return replace(model, vocab=-(-model.vocab // m) * m)


def evaluate(model, layout, recipe, base, full, micro_batches, gpu) -> Option:
    """One layout and recompute choice: modeled peak per GPU and step time."""
    shaped = padded(model, layout.tp)
    mem = sm.step_memory(shaped, layout, recipe, base, full_layers=full)
    s, b, h, a, L, t = model.seq, layout.micro_batch, model.hidden, model.heads, model.layers, \
        layout.tp
    fwd = at_scale.layer_forward_flops(s, b, h)
    rec = (L - full) * at_scale.layer_recompute_flops(s, b, h, a, base) + full * fwd
    head = 6 * s * b * h * shaped.vocab
    per_gpu = micro_batches * (3 * L * fwd + rec + head) / t
    dtype = "fp32" if recipe == "fp32" else "bf16"
    compute = per_gpu / roofline.peak_flops(gpu, dtype)
    node, intra, inter = LINKS[roofline.spec(gpu)["name"]]
    act = sm.RECIPES[recipe].activation * s * b * h
    tp_bytes = (4 * L + 2 * full) * 2 * (t - 1) / t * act * micro_batches
    psi = shaped.params(t)
    d = layout.dp
    link = inter if layout.gpus > node else intra
    ring = (d - 1) / d
    if layout.zero == 3:
        dp_bytes = ring * psi * sm.RECIPES[recipe].param * 2 * micro_batches \
            + ring * psi * sm.RECIPES[recipe].grad
    else:
        dp_bytes = 2 * ring * psi * sm.RECIPES[recipe].grad
    big = max(mem.transients.items(), key=lambda kv: kv[1])
    return Option(layout, base, full, mem.peak, dict(mem.terms), big,
                  micro_batches * rec / t, compute, tp_bytes / intra, dp_bytes / link)


def layouts(model, gpus: int, gpu: str, micro_batch: int, sp_too: bool = True) -> list:
    node = LINKS[roofline.spec(gpu)["name"]][0]
    out, t = [], 1
    while t <= min(node, gpus):
        if gpus % t == 0 and model.heads % t == 0 and model.hidden % t == 0:
            d = gpus // t
            for sp in ((False, True) if t > 1 and sp_too else (False,)):
                for zero in (range(4) if d > 1 else (0,)):
                    out.append(sm.Layout(d, t, sp, zero, micro_batch))
        t *= 2
    return out


def plan(model, gpus: int, gpu: str, memory: float, batch: int | None = None,
         micro_batch: int = 1, recipe: str = "bf16") -> tuple:
    """(the chosen Option or None, per layout its cheapest fitting Option or the reason none
    fits). batch: global batch (default: one micro-batch per data-parallel rank)."""
    rows = []
    for layout in layouts(model, gpus, gpu, micro_batch):
        per_rank = batch if batch is not None else layout.dp * micro_batch
        if per_rank % (layout.dp * micro_batch):
            rows.append((layout, f"batch {per_rank} is not a multiple of d x micro-batch = "
                                 f"{layout.dp * micro_batch}"))
            continue
        m = per_rank // (layout.dp * micro_batch)
        best = None
        for base in BASES:
            for full in range(model.layers + 1):
                opt = evaluate(model, layout, recipe, base, full, m, gpu)
                if opt.peak <= memory:
                    if best is None or (opt.recompute_flops, opt.step_s) < \
                            (best.recompute_flops, best.step_s):
                        best = opt
                    break
        if best is None:
            least = evaluate(model, layout, recipe, "none", model.layers, m, gpu)
            term = max(least.terms.items(), key=lambda kv: kv[1])
            rows.append((layout, f"needs {least.peak / GIB:.1f} GiB even with full recompute; "
                                 f"largest term {term[0]} {term[1] / GIB:.1f} GiB"))
        else:
            rows.append((layout, best))
    fits = [r[1] for r in rows if isinstance(r[1], Option)]
    chosen = min(fits, key=lambda o: (o.recompute_flops, o.step_s, o.peak), default=None)
    return chosen, rows


def _layout_text(lay: sm.Layout) -> str:
    return (f"t={lay.tp}{' +SP' if lay.sp else ''} d={lay.dp} "
            f"{'FSDP/ZeRO-3' if lay.zero == 3 else f'ZeRO-{lay.zero}'}")


def report(model, chosen, rows, gpus, gpu, memory, recipe) -> str:
    name = roofline.spec(gpu)["name"]
    lines = [f"plan: GPT L={model.layers} h={model.hidden} a={model.heads} s={model.seq} "
             f"V={model.vocab} ({model.params() / 1e9:.2f}B parameters), {recipe}, on {gpus} "
             f"x {name} with {memory / GIB:.0f} GiB each (every number modeled)"]
    if chosen is None:
        lines.append("NOTHING FITS: every layout needs more memory than the GPU has")
    else:
        c = chosen
        lines += [f"chosen: {_layout_text(c.layout)}, micro-batch {c.layout.micro_batch}; "
                  f"recompute: {c.recompute_text(model.layers)}",
                  "  peak per GPU " + f"{c.peak / GIB:.2f} GiB = " + " + ".join(
                      f"{k} {v / GIB:.2f}" for k, v in c.terms.items())
                  + f" + {c.transient[0]} {c.transient[1] / GIB:.2f}",
                  f"  recompute {c.recompute_flops / 1e12:.1f} TFLOP per GPU per step; step "
                  f"{c.step_s:.2f} s (compute {c.compute_s:.2f} s at peak, tensor-parallel "
                  f"comm {c.tp_comm_s:.2f} s, data-parallel comm {c.dp_comm_s:.2f} s overlapped)"]
    lines += ["", f"{'layout':<24} {'recompute':<44} {'peak GiB':>9} {'recomp TF':>10} "
              f"{'step s':>8}"]
    order = sorted(rows, key=lambda r: (0, r[1].recompute_flops, r[1].step_s)
                   if isinstance(r[1], Option) else (1, 0, 0))
    for lay, o in order:
        if isinstance(o, Option):
            lines.append(f"{_layout_text(lay):<24} {o.recompute_text(model.layers):<44} "
                         f"{o.peak / GIB:>9.2f} {o.recompute_flops / 1e12:>10.1f} "
                         f"{o.step_s:>8.2f}")
        else:
            lines.append(f"{_layout_text(lay):<24} does not fit: {o}")
    return "\n".join(lines)


def hf_config(path) -> sm.GPTShape:
    """A GPT-2 config.json (Hugging Face's keys) as a GPTShape; nothing is downloaded."""
    try:
        cfg = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"--hf-config {path}: cannot read a JSON config ({e})") from None
    if cfg.get("model_type") not in (None, "gpt2"):
        raise UsageError(f"--hf-config: model_type {cfg.get('model_type')!r}: only GPT-2's "
                         "layer (4h GeLU MLP, LayerNorm) is modeled; a Llama's SwiGLU MLP and "
                         "RMSNorm are not Korthikanti's layer")
    try:
        return sm.GPTShape(cfg["n_layer"], cfg["n_embd"], cfg["n_head"], cfg["n_positions"],
                           cfg["vocab_size"], tied=cfg.get("tie_word_embeddings", True))
    except KeyError as e:
        raise UsageError(f"--hf-config: no {e} in {path}") from None


def model_of(text: str) -> sm.GPTShape:
    if text in MODELS:
        return MODELS[text]
    m = re.fullmatch(r"gpt:(\d+),(\d+),(\d+),(\d+),(\d+)", text)
    if m is None:
        raise UsageError(f"--model: expected one of {sorted(MODELS)} or gpt:L,h,a,s,V, got "
                         f"{text!r}")
    L, h, a, s, V = map(int, m.groups())
    if min(L, h, a, s, V) < 1 or h % a:
        raise UsageError(f"--model {text}: sizes must be positive and heads must divide h")
    return sm.GPTShape(L, h, a, s, V)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ckptlab plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2-small")
    p.add_argument("--hf-config", help="a GPT-2 config.json instead of --model")
    p.add_argument("--gpu", default="a100", help="a GPU of ckptlab.measure.roofline's table")
    p.add_argument("--gpus", type=positive_int, default=1)
    p.add_argument("--memory-gb", type=float, required=True, help="GiB per GPU")
    p.add_argument("--batch", type=positive_int, help="global batch (default: d x micro)")
    p.add_argument("--micro-batch", type=positive_int, default=1)
    p.add_argument("--recipe", choices=sorted(sm.RECIPES), default="bf16")
    p.add_argument("--sequential", help="MODULE:FACTORY returning a torch.nn.Sequential")
    p.add_argument("--input-shape", help="with --sequential: one GPU's input, e.g. 64,512")
    a = p.parse_args(argv)
    model = hf_config(a.hf_config) if a.hf_config else model_of(a.model)
    try:
        name = roofline.spec(a.gpu)["name"]
    except ValueError as e:
        raise UsageError(str(e)) from None
    if name not in LINKS:
        raise UsageError(f"--gpu {a.gpu}: no interconnect figures for {name}; expected one of "
                         f"{sorted(LINKS)}")
    if not a.memory_gb > 0:
        raise UsageError(f"--memory-gb: expected a positive number, got {a.memory_gb}")
    memory = a.memory_gb * GIB
    if a.sequential:
        from ckptlab.cli import plan_sequential
        if not a.input_shape:
            raise UsageError("--sequential needs --input-shape (one GPU's input, e.g. 64,512)")
        modules, x = plan_sequential.load(a.sequential, a.input_shape)
        rows = plan_sequential.plan(modules, x, a.gpus, a.gpu, memory, a.recipe)
        print(plan_sequential.report(rows, a.gpus, a.gpu, memory))
        return 0 if any("plan" in r for r in rows) else 1
    chosen, rows = plan(model, a.gpus, a.gpu, memory, a.batch, a.micro_batch, a.recipe)
    print(report(model, chosen, rows, a.gpus, a.gpu, memory, a.recipe))
    return 0 if chosen is not None else 1


if __name__ == "__main__":
    sys.exit(main())
