"""Memory against speed where the bargain holds: naive, stored and flash at a size where every
launch fills the GPU's waves and stored's S no longer fits its L2, modeled; and the small sizes
the emulator ran, as the model's check (counted bytes and saved bytes against their models).

At the toy sizes a CPU can run, a launch fills a fraction of one wave and the modeled times are
mostly launch costs: there the figure would say nothing about speed. The byte and FLOP models
equal the emulator's counts at every size tried (tests/test_attention_traffic.py), so the time
model can carry them to a size that means something:

    at_scale_size(gpus, d)               the smallest N >= 4096 (B = 1, H = 16 unless given)
                                         where, on every GPU, every launch fills a wave
                                         (timemodel.fills_waves_from) and S exceeds the L2
                                         (timemodel.s_exceeds_l2_from)
    at_scale_points(B, H, N, d, gpus)    one point per method: saved bytes (modeled), hardware
                                         FLOPs, a modeled time (lower-upper bound) per GPU
    check_points(rows)                   bench_attention's rows, counted against modeled

tradeoff_plots.plot_memory_vs_speed_at_scale draws the two side by side.
"""

from __future__ import annotations

from ckptlab.measure import timemodel

SAVED = {"naive": ("P",), "stored": ("S", "O", "L"), "flash": ("O", "L")}  # what each keeps
AT_SCALE = dict(B=1, H=16, n_min=4096)  # the sizes issue from here: launches fill the waves


def saved_bytes(method: str, B, H, N, d, causal=False, dtype: str = "fp32") -> int:
    """Bytes `method`'s forward keeps for its backward (SAVED), modeled: P (B, H, N, N) for naive,
    S (the same shape, fp32 in every precision: timemodel.SCORE_BYTES), O (B, H, N, d) and L
    (B, H, N, fp32) for stored, O and L for flash; elements of P and O at the dtype's size (at
    16 bits naive is a what-if: no tensor-core kernel). Causal masking writes fewer scores but
    the arrays are held whole. The wrappers' ledger holds exactly this
    (tests/test_memory_speed.py)."""
    if method not in SAVED:
        raise ValueError(f"method: expected one of {sorted(SAVED)}, got {method!r}")
    e = timemodel.DTYPES[dtype]
    size = {"P": B * H * N * N * e, "S": B * H * N * N * timemodel.SCORE_BYTES,
            "O": B * H * N * d * e, "L": B * H * N * 4}
    return sum(size[name] for name in SAVED[method])


def at_scale_size(gpus, d: int = 64, B: int = AT_SCALE["B"], H: int = AT_SCALE["H"],
                  n_min: int = AT_SCALE["n_min"], methods=timemodel.CHAIN) -> int:
    """The smallest power-of-two N >= n_min at which, on every GPU of `gpus`, every launch of
    `methods` fills at least one wave and stored's S (B H N^2 fp32 scores) exceeds the L2."""
    n = n_min
    for gpu in gpus:
        waves = timemodel.fills_waves_from(B, H, d, gpu, methods)
        if waves is None:
            raise ValueError(f"at B={B} H={H} d={d} no N fills every wave of {gpu}")
        n = max(n, waves, timemodel.s_exceeds_l2_from(gpu, B, H))
    return n


def at_scale_points(B, H, N, d, gpus, *, methods=timemodel.CHAIN, dtype: str = "fp32",
                    causal=False, deterministic=False) -> list[dict]:
    """One point per method for tradeoff_plots: name, memory_bytes (saved_bytes), flops
    (hardware, recompute included) and times {"<GPU> (modeled)": (lower, upper)} from
    timemodel.method_time. A method with no kernel at this dtype (naive at 16 bits) is named
    a what-if."""
    points = []
    for m in methods:
        times, what_if, flops = {}, False, None
        for gpu in gpus:
            t = timemodel.method_time(m, B, H, N, N, d, gpu, causal=causal,
                                      deterministic=deterministic, dtype=dtype)
            times[f"{timemodel.short_name(gpu)} (modeled)"] = (t.lower, t.upper)
            what_if = what_if or t.what_if
            flops = sum(x.flops for x in t.launches["counted"])
        points.append(dict(name=f"{m} (a what-if: no {dtype} kernel)" if what_if else m,
                           method=m, memory_bytes=saved_bytes(m, B, H, N, d, causal, dtype),
                           flops=flops, times=times))
    return points


def check_points(rows: list[dict]) -> list[dict]:
    """The model's check from bench_attention.sweep's rows: per (method, N), each quantity the
    emulator counted (counted bytes, unique bytes) or the ledger held (saved bytes) beside its
    model; on a GPU (nothing counted) the measured time beside its modeled bounds on the GPU
    that ran, when it is one of the modeled GPUs."""
    out = []
    for r in rows:
        if r.get("bytes_source") == "counted":
            for what, got, model in (("counted bytes", r["counted_bytes"],
                                      r["modeled_counted_bytes"]),
                                     ("unique bytes", r["unique_bytes"],
                                      r["modeled_unique_bytes"]),
                                     ("saved bytes", r["saved_bytes"],
                                      saved_bytes(r["impl"], r["B"], r["H"], r["N"], r["d"],
                                                  r["causal"]))):
                out.append(dict(method=r["impl"], N=r["N"], quantity=what, got=got,
                                modeled=(model, model), source="emulator"))
        elif "time_s" in r:
            ran = r["time_source"]
            for gpu in r["modeled_gpus"].split(","):
                g = timemodel.short_name(gpu)
                if g.lower() in ran.lower():
                    out.append(dict(method=r["impl"], N=r["N"], quantity="time",
                                    got=r["time_s"], modeled=(r[f"{g}_lo_s"], r[f"{g}_hi_s"]),
                                    source="measured"))
    return out
