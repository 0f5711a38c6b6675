"""What the kernels do not do, modeled and labelled as a what-if: stored keeping a 16-bit P.

ckptlab's stored kernels keep the scaled scores S in fp32 (4 bytes a score, in both precisions:
ckptlab.measure.traffic and traffic_tc) and form P = exp(S - L) again in the backward. A kernel
that stored P itself in 16 bits would move 2 bytes a score where these move 4, with the same
launches, tiles and FLOPs (the backward would skip one exp a score, which the model does not
count anyway). stored_p16_time is stored's modeled forward + backward with every byte of S
halved; everything else is timemodel.method_time's. The rule it obeys: recompute pays while
d < R / 3 (crossing.rule_of_thumb(..., score_bytes=2)).
"""

from __future__ import annotations

from dataclasses import replace

from ckptlab.measure import occupancy, roofline, timemodel

NOTE = ("what-if: stored with a 16-bit P (2 bytes a score) in place of its fp32 S, the same "
        "launches, tiles and FLOPs; no such kernel runs")


def _halved(per_arg: dict) -> dict:
    return {n: (b // 2 if n == "S" else b) for n, b in per_arg.items()}


def stored_p16_time(B, H, Nq, Nk, d, device, *, causal=False, deterministic=False,
                    dtype: str = "fp32") -> timemodel.MethodTime:
    """Stored's launches (timemodel.timed_launches) with S's bytes halved, timed at both bounds."""
    name = roofline.spec(device)["name"]
    runs, _ = timemodel.timed_launches("stored", B, H, Nq, Nk, d, causal, deterministic, dtype)
    out: dict = {b: [] for b in timemodel.BOUNDS}
    for kt in runs:
        kt = replace(kt, read=_halved(kt.read), write=_halved(kt.write),
                     unique_read=_halved(kt.unique_read), unique_write=_halved(kt.unique_write))
        blocks, threads = occupancy.geometry(kt.kernel, B, H, Nq, Nk, d)
        nbytes = timemodel.launch_bytes(kt, dtype)
        for bound in timemodel.BOUNDS:
            out[bound].append(timemodel.launch_time(kt.kernel, blocks, threads, kt.flops,
                                                    nbytes[bound], name, dtype))
    return timemodel.MethodTime("stored-p16", name, dtype, out, NOTE, True)


def add_p16_gains(rows: list[dict]) -> list[dict]:
    """Each row of crossing.recompute_gains with gain_p16_unique: the 16-bit-P what-if's
    modeled time (unique bytes) over flash's."""
    for r in rows:
        t = stored_p16_time(r["B"], r["H"], r["N"], r["N"], r["d"], r["gpu"],
                            causal=r["causal"], dtype=r["dtype"])
        r["gain_p16_unique"] = t.lower / r["flash_lo_s"]
    return rows
