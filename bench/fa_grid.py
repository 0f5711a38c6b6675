"""FlashAttention 2's own accuracy test grid, run through ckptlab.torch.flash_attn_func on the
emulator (CPU tensors): how often does ckptlab miss FlashAttention's rule?

    python bench/fa_grid.py            # d x (seqlen_q, seqlen_k) of flash_attn's tests (~3 min)
    python bench/fa_grid.py --long     # (1023, 1024) and (1024, 1023), MQA (~3 min)

The rule (flash_attn's tests/test_flash_attn.py, test_flash_attn_output): for out, dQ, dK, dV,
max |x - truth| <= 2 max |yardstick - truth|, truth attention_ref's default (the attention of
the same 16-bit inputs computed in fp32, cast to their dtype), the yardstick attention_ref(upcast=
False, reorder_ops=True): the same attention in the inputs' dtype with k scaled, each op rounding
to it. With dropout, the reference uses the kernel's own mask,
decoded from S_dmask's signs as flash_attn's tests decode it. Prints each case that misses and
a count; exits 1 if any missed. Needs PyTorch (exits 0 saying so without it).
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time

try:
    import torch
except ImportError:
    print("bench/fa_grid.py needs PyTorch (pip install -e '.[torch]'): nothing run")
    sys.exit(0)

from ckptlab import emu
from ckptlab.reference import causal_visible
from ckptlab.torch import flash_attn_func

GRID = dict(d=[32, 40, 59, 64, 96, 111, 128],
            seqlens=[(113, 203), (128, 217), (113, 211), (108, 256), (256, 512)],
            batch=2, heads=(3, 3))
LONG = dict(d=[64, 128], seqlens=[(1023, 1024), (1024, 1023)], batch=1, heads=(4, 1))


def reference(q, k, v, causal, mask, p, dtype):
    """Attention (batch, seqlen_q, nheads, d) computed in `dtype` and returned in q's dtype
    (attention_ref: upcast when `dtype` is wider), bottom-right causal, a row that sees no key
    0, k and v's heads repeated for MQA / GQA, dropout by `mask`; S = q (k / sqrt(d))^T, k
    scaled (reorder_ops=True; the truth's fp32 rounds either order alike)."""
    g = q.shape[2] // k.shape[2]
    kk, vv = (t.to(dtype).repeat_interleave(g, dim=2) for t in (k, v))
    S = torch.einsum("bthd,bshd->bhts", q.to(dtype), kk / math.sqrt(q.shape[-1]))
    if causal:
        S = S.masked_fill(~torch.from_numpy(causal_visible(*S.shape[-2:])), -math.inf)
    sees = ~torch.isinf(S).all(-1, keepdim=True)
    P = torch.softmax(S.masked_fill(~sees, 0.0), dim=-1) * sees
    if mask is not None:
        P = P.masked_fill(~mask, 0.0) / (1 - p)
    return torch.einsum("bhts,bshd->bthd", P, vv).to(q.dtype)


def run_case(dtype, d, Nq, Nk, causal, p, batch, heads) -> list[tuple[str, float]]:
    """[(name, error / yardstick error)] for the quantities that miss the rule."""
    torch.random.manual_seed(0)
    H, Hk = heads
    q = torch.randn(batch, Nq, H, d, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(batch, Nk, Hk, d, dtype=dtype, requires_grad=True) for _ in range(2))
    with emu.settings(mode="fast"):
        out, _, S_dmask = flash_attn_func(q, k, v, p, causal=causal, return_attn_probs=True)
        dout = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), dout)
    mask = S_dmask[:, :, :Nq, :Nk] >= 0 if p > 0 else None
    out_ref = reference(q, k, v, causal, mask, p, torch.float32)  # fp32, cast to dtype
    out_pt = reference(q, k, v, causal, mask, p, dtype)
    truth = [out_ref.detach(), *torch.autograd.grad(out_ref, (q, k, v), dout)]
    yard = [out_pt.detach(), *torch.autograd.grad(out_pt, (q, k, v), dout)]
    missed = []
    for name, x, t, y in zip(("out", "dQ", "dK", "dV"), (out, *grads), truth, yard,
                             strict=True):
        err = float((x.detach().double() - t).abs().max())
        err_pt = float((y.double() - t).abs().max())
        if not err <= 2 * err_pt:  # FlashAttention's rule, no slack; a NaN error misses
            missed.append((name, err / err_pt if err_pt else math.inf))
    return missed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--long", action="store_true", help="the 1024-long MQA cases instead")
    args = ap.parse_args(argv)
    grid = LONG if args.long else GRID
    start, n, misses = time.perf_counter(), 0, 0
    for dtype, d, (Nq, Nk), causal, p in itertools.product(
            (torch.float16, torch.bfloat16), grid["d"], grid["seqlens"], (False, True),
            (0.0, 0.17)):
        missed = run_case(dtype, d, Nq, Nk, causal, p, grid["batch"], grid["heads"])
        n += 1
        misses += bool(missed)
        for name, ratio in missed:
            print(f"MISS {str(dtype)[6:]} d={d} Nq={Nq} Nk={Nk} causal={causal} p={p}: {name} "
                  f"{ratio:.2f}x PyTorch's same-dtype error (rule: 2x)", flush=True)
    print(f"{n} cases, {misses} missed FlashAttention's rule "
          f"({time.perf_counter() - start:.0f} s)")
    return 1 if misses else 0


if __name__ == "__main__":
    from ckptlab.args import exit_with  # one line for a write error; quiet into | head

    exit_with(main)
