"""Plan a training run by modeled step time: `python -m ckptlab plan`

    python -m ckptlab plan --model gpt3-175b --gpu a100 --gpus 1024 --memory-gb 80 --batch 1536
    python -m ckptlab plan --model gpt2-small --gpu 4090 --gpus 1 --memory-gb 24 --micro-batch 16
    python -m ckptlab plan --model gpt:24,1024,16,1024,50257 ...       (layers,hidden,heads,seq,V)
    python -m ckptlab plan --model llama3-8b --gpu h100 --gpus 8 --memory-gb 80 --batch 32
    python -m ckptlab plan --hf-config config.json ...       (a GPT-2 or Llama config.json)
    python -m ckptlab plan --sequential pkg.mod:factory --input-shape 64,512 ...  (measured:
                                                      ckptlab.cli.plan_sequential)

Every layout of the GPUs is tried (ckptlab.cluster.planner): tensor parallelism t within a node
(with sequence parallelism or not), pipeline stages p (1F1B, or interleaved with v virtual
stages), data parallelism d with ZeRO stage 0-3 (0-1 with a pipeline), the micro-batch; for
each, the recompute that fits the GPU's memory (ckptlab.cluster.step_memory: per layer none,
FlashAttention's or Korthikanti's selective, with the fewest layers recomputed whole). The plan
printed is the one with the shortest modeled step (ckptlab.cluster.step_time: compute at an
achievable fraction of the peak fitted on published runs, attention launch by launch (standard
attention as Megatron-LM and PyTorch run it, FlashAttention from the lab's time model),
element-wise kernels, tensor-parallel, pipeline and data-parallel communication, the bubble),
then the runner-up (the best other layout) and what made the difference, and every layout
whose modeled step is within the model's demonstrated error of the plan's (a tie when there is
more than one: the model cannot choose between them).

--loss names the loss implementation, whose buffers the memory counts: torch (PyTorch's
F.cross_entropy: two fp32 logits-sized buffers at once in its backward, beside the saved
log-softmax) or fused (Megatron's vocabulary-parallel cross-entropy, in place).
--recipe bf16 is ZeRO's 16 bytes a parameter (16-bit gradients); bf16-fp32grad is Megatron's 18
(fp32 main gradients; with ZeRO-1 that is its distributed optimizer, 6 + 12/d).
--compare T,P evaluates one layout of your own (say a published one) beside the plan.
--offload auto (the default) keeps the model states in host memory where nothing fits the GPU
alone (ckptlab.cluster.zero_offload: ZeRO-Offload's optimizer on the CPU, or ZeRO-Infinity's
parameters streamed over PCIe), checked against --host-memory-gb a GPU; none, optimizer or params
choose.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import replace
from pathlib import Path

from ckptlab.cli import hf_llama
from ckptlab.cli.report import UsageError, positive_float, positive_int
from ckptlab.cluster import efficiency, plan_compare, planner, step_time, zero3
from ckptlab.cluster import step_memory as sm
from ckptlab.cluster import zero_offload as offloading
from ckptlab.measure import roofline

GIB = 1024**3
MODELS = {
    # Brown et al. 2020, Table 2.1: 96 layers, d_model 12288, 96 heads, n_ctx 2048; GPT-2's BPE
    "gpt3-175b": sm.GPTShape(96, 12288, 96, 2048, 50257),
    # Radford et al. 2019 (HF "gpt2" config.json: n_layer 12, n_embd 768, n_head 12,
    # n_positions 1024, vocab_size 50257)
    "gpt2-small": sm.GPTShape(12, 768, 12, 1024, 50257),
    # Meta's Llama 3 paper (Dubey et al. 2024, arXiv 2407.21783), Table 3: layers, model
    # dimension, FFN dimension, attention heads, key/value heads; vocabulary 128,256 and the
    # pre-training sequence 8,192 (section 3.4.1; Meta's config.json files; torchtitan's
    # llama3 train configs, seq_len 8192); untied output projection
    "llama3-8b": sm.LlamaShape(32, 4096, 32, 8, 14336, 8192, 128256),
    "llama3-70b": sm.LlamaShape(80, 8192, 64, 8, 28672, 8192, 128256),
    "llama3-405b": sm.LlamaShape(126, 16384, 128, 8, 53248, 8192, 128256),
}
LINKS = step_time.LINKS
BASES = planner.BASES
VOCAB_MULTIPLE = planner.VOCAB_MULTIPLE
Option = planner.Option
padded = planner.padded
plan = planner.plan  # (model, gpus, gpu, memory, batch, micro_batch, recipe, loss, ...)


def layout_text(lay: sm.Layout) -> str:
    pipe = f" p={lay.pp}" + (f" v={lay.vp}" if lay.vp > 1 else "") if lay.pp > 1 else ""
    zero = "FSDP/ZeRO-3" if lay.zero == 3 else f"ZeRO-{lay.zero}"
    if lay.offload != "none":  # ZeRO-Offload / ZeRO-Infinity on one data-parallel rank
        zero = f"offload {lay.offload}"
    return f"t={lay.tp}{' +SP' if lay.sp else ''}{pipe} d={lay.dp} {zero}"


def _terms(o: Option) -> str:
    return " + ".join(f"{k} {v:.3g}" for k, v in plan_compare.grouped(o.time).items() if v > 0)


def _offload(o: Option, model, gpu: str, recipe: str, host_memory: float) -> list[str]:
    """The offload's lines (host memory, PCIe transfers, the CPU step), none without."""
    if o.layout.offload == "none":
        return []
    p = o.time.parts
    fwd = p["matmul_f"] + p["attention_f"] + p["elementwise_f"] + p["tp_f"]
    return offloading.describe(padded(model, o.layout.tp), o.layout, sm.recipe_of(recipe),
                               roofline.spec(gpu)["name"], o.micro_batches, fwd,
                               o.time.micro_batch_s - fwd, host_memory,
                               min(step_time.links(gpu)[0], o.layout.gpus))


def _describe(o: Option, model, gpus: int, gpu: str, recipe: str,
              host_memory: float = offloading.HOST_MEMORY) -> list[str]:
    lay, mem = o.layout, o.memory
    big = max(mem.transients.items(), key=lambda kv: kv[1], default=("transient", 0))
    stage = f" (pipeline stage {mem.stage} of {lay.pp})" if lay.pp > 1 else ""
    batch = lay.micro_batch * o.micro_batches * lay.dp
    dtype = "fp32" if recipe == "fp32" else "bf16"
    mfu = step_time.model_flops(model, batch) / o.step_s / gpus / roofline.peak_flops(gpu, dtype)
    return [f"  micro-batch {lay.micro_batch} x {o.micro_batches} a step (batch {batch}); "
            f"recompute: {o.recompute_text(model.layers)}",
            f"  peak per GPU{stage} {o.peak / GIB:.2f} GiB = " + " + ".join(
                f"{k} {v / GIB:.2f}" for k, v in mem.terms.items()) + f" + {big[0]} "
            f"{big[1] / GIB:.2f}",
            f"  step {o.step_s:.3g} s = {_terms(o)}; MFU {mfu:.1%} (model FLOPs / step / GPUs "
            "/ peak)"] + _offload(o, model, gpu, recipe, host_memory)


def nothing_fits(rows: list, gpus: int, batch) -> str:
    reasons = [o for _, o in rows if isinstance(o, str)]
    memory = sum(r.startswith("needs") for r in reasons)
    host = sum(r.startswith("host memory") for r in reasons)
    scope = sum(r.startswith("offload is") for r in reasons)
    split = len(reasons) - memory - host - scope
    if memory == 0 and host:
        return (f"NOTHING FITS: {host} offloading layout(s) need more host memory than given "
                "(see below)")
    if memory == host == 0 and scope:
        return ("NOTHING FITS: offload is modeled for one data-parallel rank and one pipeline "
                f"stage, which no layout of the {gpus} GPUs that splits the batch has")
    if not rows:
        return f"NOTHING FITS: no layout of {gpus} GPUs (t within a node must divide the heads)"
    if memory == 0:
        return (f"NOTHING FITS: the batch {batch} divides no layout of the {gpus} GPUs (d, and "
                "d x micro-batch, must divide it; see the reasons below)")
    need = "1 layout needs" if memory == 1 else f"{memory} layouts need"
    return (f"NOTHING FITS: {need} more memory than the GPU has"
            + (f", {split} cannot split the batch {batch}" if split else "")
            + (f"; offloaded to the host, {host} need more host memory than given (see below)"
               if host else ""))


def _compute_text(model, gpu, achievable) -> str:
    if achievable is not None:
        return f"compute at {achievable:g} of the peak (--achievable)"
    f = step_time.efficiency(model, sm.Layout(), gpu)
    return (f"compute at {f:.3g} of the peak ({efficiency.E_MAX:g} h / (h + "
            f"{efficiency.X_HALF:g}), fitted on published runs: bench plan-check)")


def _links_text(gpu) -> str:
    f = step_time.fabric(gpu)
    return (f"{f.name}, {f.node} GPUs a node: {f.intra / 1e9:.0f} GB/s a GPU inside it "
            f"({f.nvlink_achieved:.0%} of {f.nvlink / 1e9:.0f}), {f.nics} network adapters of "
            f"{f.nic * f.nic_achieved / 1e9:.0f} GB/s shared by its GPUs across nodes (rates "
            "NCCL is measured to reach: ckptlab.cluster.links)")


def report(model, chosen, rows, gpus, gpu, memory, recipe, loss="torch",
           achievable=None, compare=None, everything=False,
           batch=None, host_memory=offloading.HOST_MEMORY) -> str:
    name = roofline.spec(gpu)["name"]
    lines = [f"plan: {model.describe()} ({model.params() / 1e9:.2f}B parameters), {recipe}, "
             f"on {gpus} x {name} with {memory / GIB:.3g} GiB each (every number modeled)",
             f"  loss: {sm.LOSSES[loss]}",
             f"  {_compute_text(model, gpu, achievable)}; data-parallel traffic overlapped as "
             "ckptlab.cluster.step_time says", f"  links: {_links_text(gpu)}"]
    if chosen is None:
        lines.append(nothing_fits(rows, gpus, batch))
    else:
        if chosen.layout.offload != "none" and any(lay.offload == "none" for lay, _ in rows):
            lines.append("nothing fits the GPU alone: model states offloaded to host memory "
                         "(--offload auto; --offload none to refuse)")
        lines += [f"chosen: {layout_text(chosen.layout)}"] + _describe(chosen, model, gpus, gpu,
                                                                       recipe, host_memory)
        second = plan_compare.runner_up(chosen, rows)
        if second is not None:
            lines += [f"runner-up: {layout_text(second.layout)}, step {second.step_s:.3g} s "
                      f"({second.step_s / chosen.step_s - 1:+.1%}): it loses on "
                      f"{plan_compare.why_faster(chosen, second)}"]
        lines += _ties(chosen, rows)
    if compare is not None:
        lay, opt = compare
        if isinstance(opt, Option):
            verdict = ("as fast as the plan" if opt.step_s <= chosen.step_s
                       else f"{opt.step_s / chosen.step_s - 1:+.1%} against the plan: it loses "
                       f"on {plan_compare.why_faster(chosen, opt)}")
            lines += [f"your layout: {layout_text(opt.layout)}, step {opt.step_s:.3g} s, "
                      f"{verdict}"] + _describe(opt, model, gpus, gpu, recipe)
        else:
            lines.append(f"your layout: {lay}: does not fit: {opt}")
    fits = sorted((o for _, o in rows if isinstance(o, Option)), key=lambda o: o.step_s)
    best: dict = {}
    for o in fits:
        best.setdefault(planner.family(o.layout), o)
    shown = list(best.values()) if everything else list(best.values())[:12]
    lines += ["", f"{'layout':<30}{'b':>3}{'m':>5}  {'recompute':<42}{'peak GiB':>9}"
              f"{'step s':>9}"]
    for o in shown:
        lines.append(f"{layout_text(o.layout):<30}{o.layout.micro_batch:>3}"
                     f"{o.micro_batches:>5}  {o.recompute_text(model.layers)[:42]:<42}"
                     f"{o.peak / GIB:>9.2f}{o.step_s:>9.3g}")
    if len(best) > len(shown):
        lines.append(f"... and {len(best) - len(shown)} more layouts that fit (--all)")
    bad, pruned = {}, {}
    for lay, o in rows:
        if isinstance(o, str) and planner.family(lay) not in best:
            (pruned if planner.is_pruned(o) else bad).setdefault(planner.family(lay), (lay, o))
    for lay, o in list(bad.values())[: None if everything else 8]:
        lines.append(f"{layout_text(lay):<30} does not fit: {o}")
    if len(bad) > 8 and not everything:
        lines.append(f"... and {len(bad) - 8} more that do not fit (--all)")
    for lay, o in list(pruned.values())[: None if everything else 4]:
        lines.append(f"{layout_text(lay):<30} {o}")
    if len(pruned) > 4 and not everything:
        lines.append(f"... and {len(pruned) - 4} more pruned as slower, not evaluated (--all)")
    return "\n".join(lines)


def _ties(chosen, rows) -> list[str]:
    """The layouts whose modeled step is within the model's demonstrated error of the plan's:
    a tie when there is more than one."""
    close = plan_compare.within_error(chosen, rows)
    err = f"{plan_compare.MODEL_ERROR:.1%}"
    if len(close) <= 1:
        return [f"a decision: no other layout within the model's demonstrated error ({err}, "
                "the median |error| on bench plan-check's held-out runs)"]
    return [f"a tie: {len(close)} layouts within the model's demonstrated error ({err}, the "
            "median |error| on bench plan-check's held-out runs) of the fastest; the model "
            "cannot tell them apart:"] + [
        f"  {layout_text(o.layout)} b={o.layout.micro_batch}, step {o.step_s:.3g} s "
        f"({o.step_s / chosen.step_s - 1:+.1%})" for o in close]


def _int(cfg: dict, key: str, path) -> int:
    x = cfg.get(key)
    if x is None:
        raise UsageError(f"--hf-config: no {key!r} in {path}")
    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
        raise UsageError(f"--hf-config {path}: {key} must be a positive integer, got {x!r}")
    return x


def hf_config(path):
    """A GPT-2 config.json (Hugging Face's keys) as a GPTShape, a Llama one as a LlamaShape
    (ckptlab.cli.hf_llama); nothing is downloaded. Every value is checked before anything is
    planned."""
    try:
        cfg = json.loads(Path(path).read_text())
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"--hf-config {path}: cannot read a JSON config ({e})") from None
    if not isinstance(cfg, dict):
        raise UsageError(f"--hf-config {path}: expected a JSON object of settings, got a "
                         f"{type(cfg).__name__}")
    hf_llama.refuse_unknown(cfg)
    if cfg.get("model_type") == "llama":
        return hf_llama.llama_config(cfg, path)
    L, h, a = (_int(cfg, k, path) for k in ("n_layer", "n_embd", "n_head"))
    s, V = _int(cfg, "n_positions", path), _int(cfg, "vocab_size", path)
    tied = cfg.get("tie_word_embeddings", True)
    if not isinstance(tied, bool):
        raise UsageError(f"--hf-config {path}: tie_word_embeddings must be true or false, got "
                         f"{tied!r}")
    if h % a:
        raise UsageError(f"--hf-config {path}: n_head = {a} must divide n_embd = {h}")
    return sm.GPTShape(L, h, a, s, V, tied=tied)


def model_of(text: str) -> sm.GPTShape:
    if text in MODELS:
        return MODELS[text]
    m = re.fullmatch(r"gpt:(\d+),(\d+),(\d+),(\d+),(\d+)", text)
    if m is None:
        raise UsageError(f"--model: expected one of {sorted(MODELS)} or gpt:L,h,a,s,V, got "
                         f"{text!r}")
    L, h, a, s, V = (int(x) if len(x) < 12 else math.inf for x in m.groups())
    if min(L, h, a, s, V) < 1 or math.inf not in (L, h, a, s, V) and h % a:
        raise UsageError(f"--model {text}: sizes must be positive and heads must divide h")
    if math.inf in (L, h, a, s, V):
        raise UsageError(f"--model {text}: a size with 12 digits or more is more than the "
                         "planner models")
    return sm.GPTShape(L, h, a, s, V)


def _compare(text: str, model, gpus, gpu, memory, batch, micro_batch, recipe, loss,
             achievable, zero3_impl="fsdp"):
    """(label, the best Option of the layout t, p, or why it does not fit)."""
    m = re.fullmatch(r"(\d{1,4}),(\d{1,5})", text or "")
    if m is None:
        raise UsageError(f"--compare: expected T,P (tensor and pipeline sizes), got {text!r}")
    t, p = map(int, m.groups())
    label = f"t={t} p={p}"
    rows = [(lay, o) for lay, o in planner.layouts(model, gpus, gpu, batch, micro_batch)
            if lay.tp == t and lay.pp == p]
    if not rows:
        return label, (f"t = {t}, p = {p} is not a layout of {gpus} GPUs here (t a power of two "
                       "within a node dividing the heads; p dividing GPUs / t, with a layer a "
                       "stage at least)")
    best = None
    for lay, o in rows:
        if isinstance(o, str):
            continue
        if lay.zero == 3:
            lay = replace(lay, zero3=zero3_impl)
        opt = planner.best_option(model, lay, o, gpu, memory, recipe, loss,
                                  achievable=achievable)
        if opt is not None and (best is None or opt.step_s < best.step_s):
            best = opt
    return label, best if best is not None else "no micro-batch, sharding or recompute fits"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ckptlab plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2-small")
    p.add_argument("--hf-config", help="a GPT-2 or Llama config.json instead of --model")
    p.add_argument("--gpu", default="a100", help="a GPU of ckptlab.measure.roofline's table")
    p.add_argument("--gpus", type=positive_int, default=1)
    p.add_argument("--memory-gb", type=positive_float, required=True, help="GiB per GPU")
    p.add_argument("--batch", type=positive_int, help="global batch in sequences (default: one "
                   "micro-batch per pipeline)")
    p.add_argument("--micro-batch", type=positive_int, help="fix the micro-batch (default: "
                   "the planner tries powers of two up to 16)")
    p.add_argument("--recipe", choices=sorted(sm.RECIPES), default="bf16")
    p.add_argument("--loss", choices=sorted(sm.LOSSES), default="torch")
    p.add_argument("--achievable", type=positive_float, default=None, metavar="F",
                   help="fraction of the peak the arithmetic reaches, in (0, 1] (default: by "
                   "the hidden size, ckptlab.cluster.efficiency)")
    p.add_argument("--zero3", choices=zero3.IMPLEMENTATIONS, default="fsdp",
                   help="the ZeRO-3 implementation: PyTorch FSDP (a layer gathered ahead) or "
                   "DeepSpeed (stage3_prefetch_bucket_size, stage3_max_live_parameters)")
    p.add_argument("--offload", choices=offloading.CHOICES, default="auto",
                   help="model states in host memory: none, optimizer (ZeRO-Offload), params "
                   "(ZeRO-Infinity), auto (offload only where nothing fits without; default)")
    p.add_argument("--host-memory-gb", type=positive_float, default=offloading.HOST_MEMORY / GIB,
                   help="host memory a GPU may offload to, GiB (default 64)")
    p.add_argument("--compare", metavar="T,P", help="also evaluate tensor size T x pipeline P")
    p.add_argument("--all", action="store_true", help="list every layout")
    p.add_argument("--sequential", help="MODULE:FACTORY returning a torch.nn.Sequential")
    p.add_argument("--input-shape", help="with --sequential: one GPU's input, e.g. 64,512")
    a = p.parse_args(argv)
    if a.achievable is not None and a.achievable > 1:
        raise UsageError(f"--achievable: expected a fraction in (0, 1], got {a.achievable}")
    model = hf_config(a.hf_config) if a.hf_config else model_of(a.model)
    try:
        name = roofline.spec(a.gpu)["name"]
    except ValueError as e:
        raise UsageError(str(e)) from None
    if name not in LINKS:
        raise UsageError(f"--gpu {a.gpu}: no interconnect figures for {name}; expected one of "
                         f"{sorted(LINKS)}")
    memory = a.memory_gb * GIB
    if a.sequential:
        from ckptlab.cli import plan_sequential
        if not a.input_shape:
            raise UsageError("--sequential needs --input-shape (one GPU's input, e.g. 64,512)")
        modules, x = plan_sequential.load(a.sequential, a.input_shape)
        rows = plan_sequential.plan(modules, x, a.gpus, a.gpu, memory, a.recipe)
        print(plan_sequential.report(rows, a.gpus, a.gpu, memory))
        return 0 if any("plan" in r for r in rows) else 1
    try:
        planner.check_limits(model, a.gpus, a.batch, a.micro_batch)
    except ValueError as e:
        raise UsageError(str(e)) from None
    kw = dict(recipe=a.recipe, loss=a.loss, achievable=a.achievable)
    compare = None
    if a.compare:
        compare = _compare(a.compare, model, a.gpus, a.gpu, memory, a.batch, a.micro_batch,
                           **kw, zero3_impl=a.zero3)
    host = a.host_memory_gb * GIB
    chosen, rows = plan(model, a.gpus, a.gpu, memory, a.batch, a.micro_batch, **kw,
                        zero3=a.zero3, offload=a.offload, host_memory=host)
    print(report(model, chosen, rows, a.gpus, a.gpu, memory, a.recipe, a.loss, a.achievable,
                 compare, a.all, a.batch, host))
    return 0 if chosen is not None else 1


if __name__ == "__main__":
    sys.exit(main())
