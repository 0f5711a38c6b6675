"""ckptlab's attention kernels against PyTorch's scaled_dot_product_attention (SDPA): the same
shapes, the same inputs, the same timer (ckptlab.measure.time_fn), forward + backward.

    python bench/gpu_peer.py --out DIR [--n 256,1024,4096] [--batch 1] [--heads 16] [--d 64]
                             [--causal both|yes|no] [--repeats 20] [--device cuda|emu]
                             [--dtypes float32[,float16]]

Methods: ckptlab's fp32 kernels (naive, stored when it exists, flash); SDPA's math backend
(unfused, cuBLAS fp32) and memory-efficient backend (fused, recomputes P) in fp32; SDPA's flash
backend in bf16 and fp16 (tensor cores). With --dtypes float32,float16 also ckptlab's
tensor-core kernels (stored and flash, kernels/attn_flash_*_tc.cu) in fp16, against SDPA flash
fp16: the same precision. bench/gpu_check.sh leaves them out (their first NVRTC compiles are
not yet in its step budget, which no GPU has measured); run them by hand when time allows.
Ratios are ckptlab time / PyTorch time for pairs that differ in one thing (who wrote the kernel):
naive / math, stored / efficient, flash / efficient, and in fp16 stored and flash / SDPA flash
(ckptlab's stored keeps S, SDPA recomputes it). The cross-precision line (ckptlab fp32 flash
over SDPA flash bf16) says what tensor cores buy, and is labelled as such.

Writes DIR/peer.csv (one row per method and shape: median, p10, p90 seconds, model TFLOP/s) and
DIR/peer.txt (the table, the ratios with their spread, and the fp32 outputs checked against SDPA
math). Without PyTorch it times ckptlab alone and says so: never an error. On "emu" (the CPU
emulator, PyTorch on the CPU, perf_counter) it runs end to end at tiny sizes: the CPU test.
"""

from __future__ import annotations

import argparse

import numpy as np

from ckptlab import device, kernels, measure
from ckptlab.cli.report import fmt_seconds, int_list, writable_folder, write_csv
from ckptlab.measure import traffic

# (name, SDPA backend, dtype): fp32 pairs with ckptlab's kernels, bf16/fp16 is the flash backend
TORCH_METHODS = (
    ("sdpa-math", "MATH", "float32"),
    ("sdpa-efficient", "EFFICIENT_ATTENTION", "float32"),
    ("sdpa-flash", "FLASH_ATTENTION", "bfloat16"),
    ("sdpa-flash", "FLASH_ATTENTION", "float16"),
)
# ckptlab method / PyTorch method, same precision: one thing differs, who wrote the kernel
PAIRS = (
    ("naive", "float32", "sdpa-math", "float32", "unfused: S and P in HBM"),
    ("stored", "float32", "sdpa-efficient", "float32", "fused; ckptlab stores S, SDPA recomputes"),
    ("flash", "float32", "sdpa-efficient", "float32", "fused, P recomputed"),
    ("flash", "float32", "sdpa-flash", "bfloat16", "PRECISION DIFFERS: what tensor cores buy"),
    ("stored", "float16", "sdpa-flash", "float16", "tensor cores; ckptlab stores S, SDPA "
     "recomputes"),
    ("flash", "float16", "sdpa-flash", "float16", "tensor cores, P recomputed"),
)
DTYPES = ("float32", "float16")  # what --dtypes may ask of ckptlab (bf16: CuPy's untested)


def ckptlab_methods() -> dict:
    """name -> (forward, backward) of the fp32 kernels this checkout has (gpu_ncu.py too)."""
    methods = {"naive": (kernels.naive_forward, kernels.naive_backward)}
    if hasattr(kernels, "stored_forward"):
        methods["stored"] = (kernels.stored_forward, kernels.stored_backward)
    methods["flash"] = (kernels.flash_forward, kernels.flash_backward)
    return methods


def timed_methods(dtypes=("float32",)) -> dict:
    """(name, dtype) -> (forward, backward): every method in fp32; stored and flash in fp16
    (the wrappers pick the tensor-core kernels for 16-bit inputs)."""
    fp32 = ckptlab_methods()
    methods = {(name, "float32"): f for name, f in fp32.items()} if "float32" in dtypes else {}
    if "float16" in dtypes:
        methods.update({(name, "float16"): fp32[name] for name in ("stored", "flash")
                        if name in fp32})
    return methods


def load_torch():
    """(torch, F, sdpa_kernel, SDPBackend), or (None, reason) when PyTorch cannot be used."""
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as e:  # missing, or too old for torch.nn.attention
        return None, f"PyTorch unavailable: {type(e).__name__}: {e}"
    if device.target() == "cuda" and not torch.cuda.is_available():
        return None, "PyTorch has no CUDA here (torch.cuda.is_available() is False)"
    return (torch, F, sdpa_kernel, SDPBackend), ""


def torch_view(a, torch):
    """The same memory as a torch tensor (DLPack from CuPy; NumPy on the CPU)."""
    return torch.from_dlpack(a) if device.target() == "cuda" else torch.from_numpy(a)


def same_stream(torch, cp):
    """A context in which PyTorch queues on CuPy's current stream, the one time_fn's events and
    stream hold are on (both default to the legacy default stream: then nothing changes)."""
    ptr = cp.cuda.get_current_stream().ptr
    if torch.cuda.current_stream().cuda_stream == ptr:
        return torch.cuda.stream(torch.cuda.current_stream())
    return torch.cuda.stream(torch.cuda.ExternalStream(ptr))


def flops_per_call(B, H, N, d, causal) -> int:
    """Model FLOPs of forward + backward (useful work; recompute not counted)."""
    return (traffic.model_flops(B, H, N, N, d, causal)
            + traffic.model_flops(B, H, N, N, d, causal, backward=True))


def row_of(t, **shape_and_method) -> dict:
    r = dict(shape_and_method, median_s=t.median_s, p10_s=t.p10_s, p90_s=t.p90_s,
             spread=t.spread, timer=f"{t.device}; {t.method}")
    f = flops_per_call(r["B"], r["H"], r["N"], r["d"], r["causal"])
    r["model_tflops_per_s"] = f / t.median_s / 1e12
    return r


def time_ckptlab(name, fwd, bwd, q, k, v, dO, causal, repeats):
    """Time forward + backward of one ckptlab method; also return its outputs."""
    def step():
        _, saved = fwd(q, k, v, causal=causal)
        return bwd(dO, q, k, v, saved)

    with kernels.unpoisoned():  # time the kernels, not the wrappers' NaN fills
        t = measure.time_fn(step, repeats=repeats, warmup=2, target=device.target())
    O, saved = fwd(q, k, v, causal=causal)  # poisoned again: an unwritten element shows
    return t, [device.to_numpy(x) for x in (O, *bwd(dO, q, k, v, saved))]


def time_torch(torch_api, backend, dtype, q, k, v, dO, causal, repeats):
    """Time forward + backward of SDPA with one backend; (Timing, fp32 outputs) or (None, why)."""
    torch, F, sdpa_kernel, SDPBackend = torch_api
    tq, tk, tv, tdO = (torch_view(a, torch).to(getattr(torch, dtype)) for a in (q, k, v, dO))
    for t in (tq, tk, tv):
        t.requires_grad_(True)
    which = getattr(SDPBackend, backend)

    def step():
        with sdpa_kernel(which):
            o = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
            grads = torch.autograd.grad(o, (tq, tk, tv), tdO)
        return o, grads

    try:
        o, grads = step()  # also refuses an unsupported backend/dtype before timing
    except RuntimeError as e:
        return None, f"unsupported: {str(e).strip().splitlines()[0][:160]}"
    outs = [x.detach().float().cpu().numpy() for x in (o, *grads)]
    if device.target() == "cuda":
        with same_stream(torch, device.xp("cuda")):
            t = measure.time_fn(step, repeats=repeats, warmup=2, target="cuda")
    else:
        t = measure.time_fn(step, repeats=repeats, warmup=2, target=device.target())
    return t, outs


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def run(ns, B, H, d, causals, repeats, dtypes=("float32",)) -> tuple[list, list, str]:
    """Every method at every shape: (rows, cross-check lines, a note on PyTorch)."""
    torch_api, why = load_torch()
    methods = timed_methods(dtypes)
    rows, checks = [], []
    for N in ns:
        for causal in causals:
            shape = dict(B=B, H=H, N=N, d=d, causal=causal)
            q, k, v, dO = kernels.random_inputs(B, H, N, d, seed=N)
            outs = {}
            for (name, dtype), (fwd, bwd) in methods.items():
                args = [x.astype(dtype, copy=False) for x in (q, k, v, dO)]  # fp16: a copy
                t, outs[name, dtype] = time_ckptlab(name, fwd, bwd, *args[:3], args[3], causal,
                                                    repeats)
                rows.append(row_of(t, who="ckptlab", method=name, dtype=dtype, **shape))
                print(f"  ckptlab {name:<15} {dtype:<8} N={N} causal={causal}: "
                      f"{fmt_seconds(t.median_s)}", flush=True)
            if torch_api is None:
                continue
            for name, backend, dtype in TORCH_METHODS:
                t, got = time_torch(torch_api, backend, dtype, q, k, v, dO, causal, repeats)
                if t is None:
                    rows.append(dict(who="pytorch", method=name, dtype=dtype, **shape,
                                     status=got))
                    print(f"  pytorch {name:<15} {dtype:<8} N={N}: {got}", flush=True)
                    continue
                rows.append(row_of(t, who="pytorch", method=name, dtype=dtype, **shape))
                print(f"  pytorch {name:<15} {dtype:<8} N={N} causal={causal}: "
                      f"{fmt_seconds(t.median_s)}", flush=True)
                if name == "sdpa-math":
                    for (mine, mine_dtype), o in outs.items():
                        errs = ", ".join(f"{g} {rel(x, y):.1e}" for g, x, y in
                                         zip(("O", "dQ", "dK", "dV"), o, got, strict=True))
                        checks.append(f"N={N} causal={causal} ckptlab {mine} {mine_dtype} vs "
                                      f"SDPA math (fp32), relative error: {errs}")
    return rows, checks, why or torch_note(torch_api)


def torch_note(torch_api) -> str:
    torch = torch_api[0]
    return (f"PyTorch {torch.__version__}; float32 matmul precision "
            f"'{torch.get_float32_matmul_precision()}' ('highest': no TF32 in SDPA math)")


def ratios(rows) -> list[str]:
    """ckptlab / PyTorch per pair and shape: median ratio, and the p10..p90 range of it."""
    by = {(r["who"], r["method"], r["dtype"], r["N"], r["causal"]): r for r in rows
          if "median_s" in r}
    out = []
    for mine, my_dtype, theirs, their_dtype, what in PAIRS:
        for (who, m, dt, N, causal), a in by.items():
            b = by.get(("pytorch", theirs, their_dtype, N, causal))
            if who != "ckptlab" or m != mine or dt != my_dtype or b is None:
                continue
            lo, hi = a["p10_s"] / b["p90_s"], a["p90_s"] / b["p10_s"]
            out.append(f"N={N:<6} causal={causal!s:<5} ckptlab {mine} {my_dtype} / {theirs} "
                       f"{their_dtype}: {a['median_s'] / b['median_s']:.2f}x "
                       f"(p10..p90 {lo:.2f}..{hi:.2f}) [{what}]")
    return out


def table(rows) -> list[str]:
    out = [f"{'who':<8} {'method':<15} {'dtype':<9} {'N':>6} {'causal':<6} {'median':>10} "
           f"{'p10':>10} {'p90':>10} {'TFLOP/s':>8}  (* some repeats include host time)"]
    for r in rows:
        if "median_s" not in r:
            out.append(f"{r['who']:<8} {r['method']:<15} {r['dtype']:<9} {r['N']:>6} "
                       f"{r['causal']!s:<6} {r['status']}")
            continue
        out.append(f"{r['who']:<8} {r['method']:<15} {r['dtype']:<9} {r['N']:>6} "
                   f"{r['causal']!s:<6} {fmt_seconds(r['median_s']):>10} "
                   f"{fmt_seconds(r['p10_s']):>10} {fmt_seconds(r['p90_s']):>10} "
                   f"{r['model_tflops_per_s']:>8.3g}"
                   + ("  *" if "include host time" in r["timer"] else ""))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for peer.csv and peer.txt")
    p.add_argument("--n", type=int_list, default=[256, 1024, 4096])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--d", type=int, default=64, choices=kernels.HEAD_DIMS)
    p.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--device", choices=device.TARGETS, default=None)
    p.add_argument("--dtypes", default="float32",
                   help=f"ckptlab's, comma-separated, from {DTYPES} (default float32)")
    a = p.parse_args(argv)
    dtypes = [x.strip() for x in a.dtypes.split(",") if x.strip()]
    if not dtypes or any(x not in DTYPES for x in dtypes):
        p.error(f"--dtypes: expected a comma-separated subset of {DTYPES}, got {a.dtypes!r}")
    out = writable_folder(a.out)  # before any work: a bad folder is one line, status 2
    if a.device:
        device.use(a.device)
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[a.causal]
    print(f"ckptlab vs PyTorch SDPA on target {device.target()!r}: B={a.batch} H={a.heads} "
          f"d={a.d}, N={a.n}, forward + backward", flush=True)
    rows, checks, note = run(a.n, a.batch, a.heads, a.d, causals, a.repeats, dtypes)
    write_csv(rows, out / "peer.csv")
    timer = next(r["timer"] for r in rows if "timer" in r)
    lines = ([f"ckptlab vs PyTorch SDPA, forward + backward, B={a.batch} H={a.heads} d={a.d}",
              f"timer (same for both): {timer}", note, ""] + table(rows)
             + ["", "ratios: ckptlab time / PyTorch time (> 1: ckptlab slower)"]
             + (ratios(rows) or ["(no PyTorch rows: no ratios)"])
             + ["", "ckptlab's outputs against SDPA math (fp32):"] + (checks or ["(none)"]))
    (out / "peer.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    from ckptlab.args import exit_with  # one line for a write error; quiet into | head

    exit_with(main)
