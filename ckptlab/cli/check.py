"""Gradient checks of every attention kernel against float64 truth: `python -m ckptlab check`.

What a user runs after editing a kernel. For each small, odd problem (Nq != Nk both ways, N not a
multiple of any tile, head dims that are and are not a tile head dim), causal and not, dropout and
not, it runs the three methods on the current target: naive forward/backward, and for stored and
flash the forward and the backward with atomic dQ and with deterministic dQ, and compares every
output (O, L, dQ, dK, dV) with ckptlab.reference in float64:

    err   = ||x - truth|| / ||truth||     (relative Frobenius error)
    pass  iff err <= 1e-5                  (fp32 rounding, ~1e-7 per op, grown by N-, d-long sums)
          and err <= 2 * err32 + 2^-22     (FlashAttention's rule: at most twice the error of the
                                            same math in float32 NumPy; 2^-22 is one fp32
                                            rounding, for outputs float32 NumPy gets exact)

L (the logsumexp, stored and flash) must also be +inf on exactly the rows that see no key. Each
deterministic backward is run twice and must be bitwise equal. Exit code 1 on any failure.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext

import numpy as np
from tqdm import tqdm

from ckptlab import device, emu, kernels
from ckptlab import reference as ref
from ckptlab.cli.report import writable_file, write_csv
from ckptlab.reference import rel_err

TOL = 1e-5
FLOOR = 2.0**-22
OUTPUTS = ("O", "L", "dQ", "dK", "dV")
FUSED = ("stored", "flash")  # the methods with an atomic and a deterministic dQ
KERNELS = ("naive",) + tuple(f"{m} ({mode} dQ)" for m in FUSED
                             for mode in ("atomic", "deterministic"))

# (B, H, Nq, Nk, d): odd sizes, tails on every tile, Nq < Nk and Nq > Nk (causal rows that see no
# key when Nq > Nk); head dims 16..128, one padded to its tile head dim (40 -> 64) and the largest.
SIZES = [(1, 2, 17, 33, 16), (2, 1, 100, 57, 32), (1, 1, 65, 129, 64), (1, 1, 31, 47, 128),
         (1, 1, 38, 21, 40), (1, 1, 19, 26, 256)]
QUICK_SIZES = [(1, 2, 17, 33, 32)]
DROPOUT = 0.2


def _compare(x, truth, fp32) -> tuple[float, float, bool]:
    """(err, err of float32 NumPy, pass) for one output; NaN/inf in x fails (unwritten)."""
    x = np.asarray(device.to_numpy(x), np.float64)
    if not np.all(np.isfinite(x)):
        return float("nan"), rel_err(fp32, truth), False
    err, err32 = rel_err(x, truth), rel_err(fp32, truth)
    return err, err32, bool(err <= TOL and err <= 2 * err32 + FLOOR)


def _compare_L(L, truth, fp32) -> tuple[float, float, bool]:
    """L: +inf exactly where truth is (rows that see no key), the finite entries as _compare."""
    L = device.to_numpy(L)
    same_inf = np.array_equal(np.isposinf(L), np.isposinf(truth))
    fin = np.isfinite(truth)
    if not fin.any():
        return 0.0, 0.0, same_inf
    err, err32, ok = _compare(L[fin], truth[fin], fp32[fin])
    return err, err32, ok and same_inf


def inputs(B, H, Nq, Nk, d, seed: int):
    """Fresh standard-normal q, k, v, dO in float32 (NumPy, on the host)."""
    g = np.random.default_rng(seed)
    shapes = ((B, H, Nq, d), (B, H, Nk, d), (B, H, Nk, d), (B, H, Nq, d))
    return tuple(g.standard_normal(s).astype(np.float32) for s in shapes)


def check_case(B, H, Nq, Nk, d, causal: bool, dropout_p: float, seed: int = 0) -> list[dict]:
    """Every kernel on one problem; one row per kernel with each output's error and a verdict."""
    q, k, v, dO = inputs(B, H, Nq, Nk, d, seed)
    kw = dict(causal=causal, dropout_p=dropout_p, seed=1000 + seed, offset=3)
    O64, L64 = ref.forward(q, k, v, **kw)
    O32, L32 = ref.forward(q, k, v, **kw, dtype=np.float32)
    g64 = ref.backward(dO, q, k, v, **kw)
    g32 = ref.backward(dO, q, k, v, **kw, dtype=np.float32)
    xp = device.xp()
    qd, kd, vd, dOd = (xp.asarray(a) for a in (q, k, v, dO))

    runs, bitwise = {}, {}
    O, saved = kernels.naive_forward(qd, kd, vd, **kw)
    runs[KERNELS[0]] = (O, None, kernels.naive_backward(dOd, qd, kd, vd, saved))
    for method in FUSED:  # looked up by name at call time, so a patched wrapper is what runs
        forward = getattr(kernels, f"{method}_forward")
        backward = getattr(kernels, f"{method}_backward")
        O, saved = forward(qd, kd, vd, **kw)
        L = saved.tensors["L"]
        runs[f"{method} (atomic dQ)"] = (O, L, backward(dOd, qd, kd, vd, saved))
        det = backward(dOd, qd, kd, vd, saved, deterministic=True)
        runs[f"{method} (deterministic dQ)"] = (O, L, det)
        # bitwise run to run, whatever the block order: on the emulator, shuffle it (a GPU may)
        order = emu.settings(block_order="shuffled") if device.target() == "emu" else nullcontext()
        with order:
            again = backward(dOd, qd, kd, vd, saved, deterministic=True)
        bitwise[method] = all(np.array_equal(device.to_numpy(a), device.to_numpy(b))
                              for a, b in zip(det, again, strict=True))

    rows = []
    for kernel, (O, L, grads) in runs.items():
        row = dict(kernel=kernel, B=B, H=H, Nq=Nq, Nk=Nk, d=d, causal=causal,
                   dropout_p=dropout_p)
        results = {"O": _compare(O, O64, O32)}
        if L is not None:
            results["L"] = _compare_L(L, L64, L32)
        for name, g, t, t32 in zip(("dQ", "dK", "dV"), grads, g64, g32, strict=True):
            results[name] = _compare(g, t, t32)
        for name in OUTPUTS:
            err, err32, _ = results.get(name, (None, None, True))
            row[f"{name}_err"], row[f"{name}_fp32_err"] = err, err32
        failed = [name for name, r in results.items() if not r[2]]
        method = kernel.split()[0]
        if kernel.endswith("(deterministic dQ)") and not bitwise[method]:
            failed.append("bitwise repeat")
        row["failed"] = " ".join(failed)
        row["ok"] = not failed
        rows.append(row)
    return rows


def run(sizes=SIZES, progress: bool = True) -> list[dict]:
    """check_case over sizes x causal x dropout (0 and DROPOUT); all rows."""
    cases = [(s, c, p) for s in sizes for c in (False, True) for p in (0.0, DROPOUT)]
    rows = []
    bar = tqdm(cases, desc=f"gradient checks ({device.target()})", unit="case",
               disable=not progress, file=sys.stderr, leave=False)
    for k, (size, causal, p) in enumerate(bar):
        rows += check_case(*size, causal, p, seed=k)
    return rows


def _e(x) -> str:
    return "-" if x is None else f"{x:.1e}"


def format_table(rows: list[dict]) -> str:
    """One line per kernel and problem: each output's relative error vs float64, and a verdict."""
    head = (f"{'kernel':<27}{'B,H,Nq,Nk,d':<17}{'causal':<7}{'drop':<5}"
            + "".join(f"{n:>9}" for n in OUTPUTS) + "  result")
    out = [head, "-" * len(head)]
    for r in rows:
        size = f"{r['B']},{r['H']},{r['Nq']},{r['Nk']},{r['d']}"
        errs = "".join(f"{_e(r[f'{n}_err']):>9}" for n in OUTPUTS)
        verdict = "pass" if r["ok"] else f"FAIL ({r['failed']})"
        out.append(f"{r['kernel']:<27}{size:<17}{'yes' if r['causal'] else 'no':<7}"
                   f"{r['dropout_p']:<5.1f}{errs}  {verdict}")
    n_bad = sum(not r["ok"] for r in rows)
    out.append(f"{len(rows) - n_bad} of {len(rows)} passed (relative Frobenius error vs float64; "
               f"pass: <= {TOL:g} and <= 2x float32 NumPy's error + 2^-22)")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ckptlab check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help=f"one small problem instead of {len(SIZES)}")
    p.add_argument("--csv", metavar="FILE", help="also write every row as CSV")
    a = p.parse_args(argv)
    if a.csv is not None:
        writable_file(a.csv)
    rows = run(QUICK_SIZES if a.quick else SIZES)
    print(f"gradient checks on target {device.target()!r}")
    print(format_table(rows))
    if a.csv is not None:
        write_csv(rows, a.csv)
        print(f"wrote {a.csv}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
