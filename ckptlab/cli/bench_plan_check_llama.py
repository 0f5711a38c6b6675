"""The Llama section of `python -m ckptlab bench plan-check`: the step model on published
Llama-family runs (ckptlab.cluster.published_llama; all held out, none fitted on), each in the
run's own FLOP count (torchtitan's 6 N + 12 L h s a token) against its published MFU x peak,
and the plan ckptlab's planner chooses on the same GPUs and batch."""

from __future__ import annotations

from ckptlab.cluster import planner, published_llama
from ckptlab.cluster import step_memory as sm

RECIPE = "bf16"  # FSDP2's fp32 sharded parameters, gradients and Adam state: 16 bytes


def published_option(r: published_llama.LlamaRun, achievable=None):
    """The published layout as the model sees it (published_llama's docstring), or None when it
    does not fit."""
    layout = sm.Layout(dp=r.d, tp=r.t, sp=r.t > 1, zero=3, micro_batch=r.micro_batch)
    loss = "fused" if r.t > 1 else "torch"
    full = None if r.recompute == "selective op" else r.model.layers
    return planner.evaluate(r.model, layout, 1, r.gpu, r.memory, RECIPE, loss, "flash", full,
                            dropout=False, achievable=achievable)


def rows(achievable=None) -> list[dict]:
    out = []
    for r in published_llama.RUNS:
        opt = published_option(r, achievable)
        row = dict(run=r.name, source=r.source, gpus=r.gpus, gpu=r.gpu, t=r.t, d=r.d,
                   micro_batch=r.micro_batch, recompute=r.recompute,
                   published_tflops=r.published_tflops(), published_mfu=r.mfu_pct,
                   fits=opt is not None, calibration=False)
        if opt is not None:
            tokens = r.micro_batch * r.d * r.model.seq
            tf = r.flops_per_token() * tokens / opt.step_s / r.gpus / 1e12
            row.update(peak_gib=opt.peak / 2**30, step_s=opt.step_s, modeled_tflops=tf,
                       modeled_tokens_per_s=tokens / opt.step_s / r.gpus,
                       error=tf / row["published_tflops"] - 1,
                       model_recompute=opt.recompute_short(r.model.layers))
        batch = r.micro_batch * r.d
        chosen, _ = planner.plan(r.model, r.gpus, r.gpu, r.memory, batch, recipe=RECIPE,
                                 achievable=achievable, dropout=False)
        if chosen is not None:
            row.update(plan=f"{_layout(chosen.layout)}, {chosen.recompute_short(r.model.layers)}",
                       plan_step_s=chosen.step_s)
        out.append(row)
    return out


def _layout(lay: sm.Layout) -> str:
    pipe = f" p={lay.pp}" + (f" v={lay.vp}" if lay.vp > 1 else "") if lay.pp > 1 else ""
    return f"t={lay.tp}{'+SP' if lay.sp else ''}{pipe} d={lay.dp} ZeRO-{lay.zero} " \
           f"b={lay.micro_batch}"


def format_table(table: list[dict]) -> str:
    out = ["Published Llama-family runs (held out: nothing is fitted on them), each in its own "
           "FLOP count (torchtitan's 6 N + 12 L h s a token), FSDP2 as ZeRO-3, recipe bf16 (16 "
           "bytes a parameter)", "",
           f"{'run':<9}{'GPUs':>5} {'GPU':<15}{'t':>2}{'d':>5}{'b':>3} {'recompute':<13}"
           f"{'fits':<5}{'peak GiB':>9}{'publ. TF':>9}{'model TF':>9}{'error':>8}  "
           f"{'model recompute':<17}{'planner':<40}{'step s':>7}"]
    for r in table:
        line = (f"{r['run']:<9}{r['gpus']:>5} {r['gpu']:<15}{r['t']:>2}{r['d']:>5}"
                f"{r['micro_batch']:>3} {r['recompute']:<13}{'yes' if r['fits'] else 'NO':<5}")
        if r["fits"]:
            line += (f"{r['peak_gib']:>9.1f}{r['published_tflops']:>9.1f}"
                     f"{r['modeled_tflops']:>9.1f}{r['error']:>+8.1%}  "
                     f"{r['model_recompute']:<17}")
        else:
            line += f"{'':>9}{r['published_tflops']:>9.1f}{'':>17}  {'':<17}"
        if "plan" in r:
            line += f"{r['plan']:<40}{r['plan_step_s']:>7.2f}"
        out.append(line)
    held = [r for r in table if r["fits"]]
    errors = ", ".join(f"{r['run']} {r['error']:+.1%}" for r in held)
    out += ["", "TF: teraFLOP/s per GPU in torchtitan's count (published: MFU x its peak, 312 "
            "A100, 989 H100 SXM); every row held out, its error reported whatever it is",
            f"Llama rows modeled: {len(held)} of {len(table)}"
            + (f" (errors {errors})" if held else ""),
            "the 405B row ran on lower-power HBM2e H100s with 94 GB (its footnote: between SXM "
            "and NVL); the model runs the H100 SXM's peak and bandwidth",
            "Meta's Llama 3 405B layouts are not rows yet (published_llama's docstring)",
            "sources:"] + [f"  {r['run']}: {r['source']}" for r in table]
    return "\n".join(out)
