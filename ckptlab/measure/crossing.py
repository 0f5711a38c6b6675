"""When recompute stops paying: the rule of thumb d < c R, and the time model's recompute gain.

Per visible (i, j) pair, flash recomputes S (2 d FLOPs more) where stored reads it back (8 bytes
more: S in fp32, written by the forward, read by the backward). With R the ridge (peak /
bandwidth) of a GPU in a precision:

    rule_of_thumb(gpu, dtype)      c R, the head dim below which recompute pays: c = 2/3 with the
                                   launches one after another, each at its own roofline (what the
                                   time model does), 4/7 with perfect overlap (overlap=True)
    recompute_gains(gpus, dtypes, ds, N=...)
                                   stored / flash, modeled (ckptlab.measure.timemodel) at both byte
                                   bounds, per GPU, precision and head dim: what the rule leaves
                                   out (operand bytes, launches, partial waves, occupancy)
    crossings(rows)                the smallest d of a sweep whose gain is below 1
    prefetch(gpus, dtypes, ds)     the compiler's reports those times need, compiled at once
"""

from __future__ import annotations

from ckptlab.kernels import archs
from ckptlab.measure import occupancy, roofline
from ckptlab.measure.pair_counts import visible_pairs
from ckptlab.measure.timemodel import CHAIN, SCORE_BYTES, method_time, timed_launches

RULE_SIZE = dict(N=64, d=16)  # tiles divide N and d = Dt: whole tiles, no padding


def stored_launches_per_pair(dtype: str, deterministic: bool = False,
                             score_bytes: int = SCORE_BYTES) -> list[tuple[float, float]]:
    """Per visible (i, j) pair, one (FLOPs per d, bytes of S) for each launch of stored's forward
    + backward (timed_launches at RULE_SIZE; launches without FLOPs or S left out). score_bytes:
    the bytes of one stored score, 4 for the kernels' fp32 S; 2 is the what-if of a 16-bit P."""
    N, d = RULE_SIZE["N"], RULE_SIZE["d"]
    pairs = visible_pairs(N, N, False)
    out = []
    for kt in timed_launches("stored", 1, 1, N, N, d, False, deterministic, dtype)[0]:
        f = kt.flops / pairs / d
        s = (kt.read.get("S", 0) + kt.write.get("S", 0)) / pairs * score_bytes / SCORE_BYTES
        if f or s:
            out.append((f, s))
    return out


def per_pair(dtype: str, deterministic: bool = False, score_bytes: int = SCORE_BYTES) -> dict:
    """Per visible (i, j) pair, from the modeled launches method_time times (timed_launches at
    RULE_SIZE): stored's bytes of S (written by the forward, read by each backward kernel that
    reads it), and stored's and flash's hardware FLOPs in units of d."""
    N, d = RULE_SIZE["N"], RULE_SIZE["d"]
    pairs = visible_pairs(N, N, False)
    runs = stored_launches_per_pair(dtype, deterministic, score_bytes)
    flash = timed_launches("flash", 1, 1, N, N, d, False, deterministic, dtype)[0]
    return dict(s_bytes=sum(s for _, s in runs), stored_flops_per_d=sum(f for f, _ in runs),
                flash_flops_per_d=sum(kt.flops for kt in flash) / pairs / d)


def crossing_fraction(launches: list[tuple[float, float]], flash_flops_per_d: float) -> float:
    """The c for which recompute pays while d < c R: the root of
    sum_i max(f_i c, s_i) = F c (stored's launches (f_i, s_i) against flash's F, each side in
    units of 1 / peak per pair, d = c R). The left side is convex and piecewise linear, sum s_i at
    c = 0, so the root is unique; inf if stored never runs more FLOPs' worth than flash."""
    F = flash_flops_per_d
    if sum(f for f, _ in launches) >= F:
        return float("inf")
    lhs = lambda c: sum(max(f * c, s) for f, s in launches)  # noqa: E731
    cuts = sorted({s / f for f, s in launches if f > 0} | {0.0})
    cuts.append(cuts[-1] + 1 + lhs(cuts[-1]) / F)  # past every cut and past the root
    for a, b in zip(cuts, cuts[1:], strict=False):
        if lhs(b) <= F * b:  # the root lies in [a, b], where the left side is linear
            slope = (lhs(b) - lhs(a)) / (b - a)
            return (lhs(a) - slope * a) / (F - slope)
    raise AssertionError("unreachable: the left side grows slower than F c past the last cut")


def rule_fraction(dtype: str, deterministic: bool = False, *, overlap: bool = False,
                  score_bytes: int = SCORE_BYTES) -> float:
    """c in 'recompute pays while d < c R'. overlap=False, the form the time model obeys (a sum
    of per-launch maxima, no launch overlapping the next): 2/3, because stored's forward
    (4 d FLOPs, 4 bytes of S) and its dK/dV kernel (8 d, 4 bytes) turn compute-bound one at a
    time, at d = R and d = R / 2; for R/2 < d < R stored takes 4 R + 8 d against flash's 14 d.
    overlap=True, one roofline over the whole forward + backward (perfect overlap of the
    launches' memory and compute): max(12 d, 8 R) against 14 d, c = s / f = 8/14 = 4/7.
    Deterministic dQ: 2/3 in both forms. score_bytes=2 (a 16-bit P, what-if): 1/3 and 2/7."""
    if overlap:
        p = per_pair(dtype, deterministic, score_bytes)
        return p["s_bytes"] / p["flash_flops_per_d"]
    return crossing_fraction(stored_launches_per_pair(dtype, deterministic, score_bytes),
                             per_pair(dtype, deterministic)["flash_flops_per_d"])


def rule_of_thumb(gpu, dtype: str, deterministic: bool = False, *, overlap: bool = False,
                  score_bytes: int = SCORE_BYTES) -> float:
    """The head dim below which recompute pays, c R (c: rule_fraction; R the ridge of `gpu` in
    `dtype`): d < 2 R / 3 with launches one after another (the time model's form), d < 4 R / 7
    with perfect overlap (overlap=True). Past it both methods are compute-bound and the gain is
    12 / 14. It assumes full waves and the same occupancy for both methods; the time model
    (recompute_gains) assumes neither."""
    return rule_fraction(dtype, deterministic, overlap=overlap,
                         score_bytes=score_bytes) * roofline.ridge_point(gpu, dtype)


def prefetch(gpus, dtypes, ds, methods=CHAIN, *, causal=False, deterministic=False) -> None:
    """Compile at once, on every core (occupancy.prefetch), what method_time will ask the
    compiler for: the registers of each method's kernels at each head dim d, per GPU's arch."""
    for arch in dict.fromkeys(roofline.spec(g)["arch"] for g in gpus):
        names = {kt.kernel for dtype in dtypes if not archs.dtype_refusal(dtype, arch)
                 for m in methods for d in ds
                 for kt in timed_launches(m, 1, 1, 64, 64, d, causal, deterministic, dtype)[0]}
        occupancy.prefetch(names, arch)


def pair_refusal(gpu, dtype: str, d: int, *, N, B=1, H=16, causal=False,
                 deterministic=False) -> str | None:
    """Why `gpu` cannot run a launch of stored's or flash's forward + backward in `dtype` at
    head dim d (archs.refusal of the instantiation method_time would time), or None."""
    arch = roofline.spec(gpu)["arch"]
    for method in ("stored", "flash"):
        for kt in timed_launches(method, B, H, N, N, d, causal, deterministic, dtype)[0]:
            if reason := archs.refusal(kt.kernel, arch):
                return f"{kt.kernel.split('<')[0]}: {reason}"
    return None


def recompute_gains(gpus, dtypes, ds, *, N, B=1, H=16, causal=False,
                    deterministic=False) -> list[dict]:
    """One row per (GPU, dtype, d): modeled stored and flash times at both bounds and the
    recompute gain stored / flash at each (> 1: recompute pays; unique bytes: the times' lower
    bounds, counted: the upper). No row where pair_refusal (bf16 on a T4; fp16 at d = 256
    there, whose tiles need more shared memory than sm_75 has)."""
    rows = []
    prefetch(gpus, dtypes, ds, ("stored", "flash"), causal=causal, deterministic=deterministic)
    for gpu in gpus:
        name = roofline.spec(gpu)["name"]
        for dtype in dtypes:
            if archs.dtype_refusal(dtype, roofline.spec(name)["arch"]):  # bf16 on a T4
                continue
            for d in ds:
                if pair_refusal(name, dtype, d, N=N, B=B, H=H, causal=causal,
                                deterministic=deterministic):
                    continue
                t = {m: method_time(m, B, H, N, N, d, name, causal=causal,
                                    deterministic=deterministic, dtype=dtype)
                     for m in ("stored", "flash")}
                rows.append(dict(
                    gpu=name, dtype=dtype, ridge=roofline.ridge_point(name, dtype), d=d, N=N, B=B,
                    H=H, causal=causal, stored_lo_s=t["stored"].lower,
                    stored_hi_s=t["stored"].upper, flash_lo_s=t["flash"].lower,
                    flash_hi_s=t["flash"].upper,
                    gain_unique=t["stored"].lower / t["flash"].lower,
                    gain_counted=t["stored"].upper / t["flash"].upper,
                    rule_of_thumb_d=rule_of_thumb(name, dtype, deterministic),
                    rule_overlap_d=rule_of_thumb(name, dtype, deterministic, overlap=True),
                    rule_p16_d=rule_of_thumb(name, dtype, deterministic, score_bytes=2),
                    kernels=t["stored"].kernels, source="modeled"))
    return rows


def crossings(rows: list[dict], key: str = "gain_unique") -> dict:
    """(gpu, dtype) -> the smallest d of the sweep whose gain is below 1 (None: recompute pays at
    every d swept)."""
    out: dict = {}
    for r in sorted(rows, key=lambda r: r["d"]):
        out.setdefault((r["gpu"], r["dtype"]), None)
        if r[key] < 1 and out[(r["gpu"], r["dtype"])] is None:
            out[(r["gpu"], r["dtype"])] = r["d"]
    return out
