"""The row-wise exercises, one warp per row: the online softmax of kernels/softmax_rows.cu
(lab 01), the naive forward's softmax writing P (kernels/attn_naive_fwd.cu, lab 02) and the
store-P backward's dS = P * (dP - D) (kernels/attn_naive_bwd.cu, lab 03).

Each launches the learner's kernel itself, with the grid the lab's wrappers use, on inputs
that exercise what a row can hold: a row shorter than the warp, one that is not a multiple of
32, masked (-inf) scores, a row that sees no key, scores large enough to overflow exp.
"""

from __future__ import annotations

import zlib

import numpy as np

from ckptlab import device, reference
from ckptlab.exercises.write import slips
from ckptlab.exercises.write.flash_cases import shaped_scores
from ckptlab.exercises.write.spec import Case, Exercise, Output, StepText, fixed_normal
from ckptlab.kernels import naive
from ckptlab.kernels.common import ceil_div, poisoned
from ckptlab.kernels.table import SOFTMAX_ROWS, SOFTMAX_ROWS_PER_BLOCK, WARP
from ckptlab.measure import traffic


def _case(label, phrase, seed=0, **sizes_and_options):
    sizes = {k: v for k, v in sizes_and_options.items() if k in ("B", "H", "R", "C", "Nq", "Nk",
                                                                  "d")}
    options = {k: v for k, v in sizes_and_options.items() if k not in sizes}
    return Case(label, phrase, sizes, options, seed=seed or zlib.crc32(label.encode()) % 10_000)


def softmax64(x: np.ndarray) -> np.ndarray:
    """Row softmax in float64; a row of only -inf gives 0 (the kernels' convention)."""
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    s = e.sum(axis=-1, keepdims=True)
    return e / np.where(s > 0, s, 1.0)


# ---- row_softmax: kernels/softmax_rows.cu ----------------------------------------------------
def rows_inputs(case):
    (x,) = fixed_normal(case.seed, (case.sizes["R"], case.sizes["C"]))
    x = x * np.float32(case.options.get("gain", 1.0)) + np.float32(case.options.get("shift", 0))
    masked = case.options.get("masked", 0)
    if masked:  # the first `masked` columns of every other row are -inf, and row 1 entirely
        x[::2, :masked] = -np.inf
        x[1, :] = -np.inf
    return {"x": x}


def rows_run(case, inputs):
    R, C = case.sizes["R"], case.sizes["C"]
    xp = device.xp()
    x, y = xp.asarray(inputs["x"]), poisoned((R, C))
    f = device.load("softmax_rows.cu").get_function("softmax_rows")
    f((ceil_div(R, SOFTMAX_ROWS_PER_BLOCK),), (WARP * SOFTMAX_ROWS_PER_BLOCK,),
      (x, y, np.int32(R), np.int32(C)))
    return {"y": y}


def lane_softmax(x: np.ndarray, groups) -> np.ndarray:
    """The softmax each lane group would give from the columns its lanes saw alone: column c
    belongs to lane c % 32, and `groups(lane)` names the group whose (m, l) it ended with."""
    x = x.astype(np.float64)
    lanes = np.arange(x.shape[-1]) % WARP
    gid = np.array([groups(int(lane)) for lane in lanes])
    y = np.zeros_like(x)
    for g in set(gid.tolist()):
        cols = gid == g
        y[..., cols] = softmax64(x[..., cols])
    return y


def rows_slip(groups):
    return lambda case, inputs: {"y": lane_softmax(inputs["x"], groups)}


ROW_SLIPS = {
    "not_merged": ("each lane's own softmax over only its columns (the lanes never merged)",
                   rows_slip(lambda lane: lane)),
    "merge_missing_1": ("the softmax of lane pairs that never met: the last butterfly round "
                        "(offset 1) is missing", rows_slip(lambda lane: lane & 1)),
    "merge_missing_16": ("the softmax of half-warps that never met: the first butterfly round "
                         "(offset 16) is missing", rows_slip(lambda lane: lane & 16)),
}

ROW_SOFTMAX = Exercise(
    name="row_softmax", lab="01", title="a row softmax in one warp, reduced with shuffles",
    kernel="softmax_rows.cu",
    intro=("One warp per row: lane j visits the columns j, j + 32, j + 64, ... You write the",
           "lane's online (m, l) and the butterfly that merges the 32 lanes' (m, l)."),
    steps={
        1: StepText(("Each lane keeps the online softmax state of the columns it visits (c = lane,",
                     "lane + WARP, ...): m, the largest value seen so far, and l, the sum of",
                     "exp(x_c - m) over them. When a new value raises m, every term already in l",
                     "was taken against the old max: bring l to the new one (a factor e^(m_old -",
                     "m_new)) before the new term joins. Why: exp of a value minus the running max",
                     "is at most 1, so nothing overflows however large x is. Pitfall: while every",
                     "value seen is -inf (a masked prefix) m is -inf too, and -inf - (-inf) is",
                     "NaN: nothing has been summed yet, so l stays 0 until a finite value arrives.",
                     "Updates: m, l."),
                    ()),
        2: StepText(("After step 1 each lane holds (m, l) of its own columns; the softmax needs",
                     "the row's. Merge the 32 states in a butterfly: in each round every lane",
                     "exchanges (m, l) with the lane whose index differs in one bit (a shuffle by",
                     "xor; FULL_MASK names all 32 lanes) and keeps the merge of the two: the",
                     "larger max, and the two sums each brought to it before they are added (step",
                     "1's rescale). Five rounds (log2 32), the distance halving from 16 to 1, and",
                     "every lane holds the row's (m, l). Pitfall: a lane that saw no column (C <",
                     "32) or only -inf has m = -inf, l = 0: its share of the merged sum is 0, not",
                     "exp(-inf - (-inf)) = NaN. Updates: m, l, in every lane."),
                    ()),
    },
    outputs=(Output("y", ("r", "c"), {"r": SOFTMAX_ROWS_PER_BLOCK, "c": WARP}),),
    cases=(
        _case("base", "the base case", R=9, C=64),
        _case("one_tile", "rows shorter than half the warp (C = 12: lanes with no column)",
              R=9, C=12),
        _case("tail", "C not a multiple of 32", R=9, C=70),
        _case("masked", "-inf entries (masked scores; row 1 entirely)", R=9, C=70, masked=40),
        _case("large", "large values (x * 100: exp of a raw value overflows)", R=9, C=64,
              gain=100.0),
        _case("negative", "every value strongly negative (x - 1000: exp of a raw value "
              "underflows to 0)", R=9, C=64, shift=-1000.0),
        _case("huge", "values of magnitude up to about 1e4 (x * 3000)", R=9, C=64,
              gain=3000.0),
    ),
    inputs=rows_inputs, run=rows_run,
    truth=lambda case, inputs: {"y": softmax64(inputs["x"])},
    alternatives=ROW_SLIPS,
    traffic=lambda case: [traffic.softmax_rows(case.sizes["R"], case.sizes["C"])],
    kernels=("softmax_rows",),
    picture=("softmax_rows", ("y",)),
    hints={
        "one_tile": (
            "Rows shorter than the warp are wrong. What do the lanes that see no column hold, and "
            "what do they add to the merge?",
            "A lane with no column ends step 1 with m = -inf and l = 0; in step 2 its share of "
            "the merged sum must be 0, and its m must never meet another -inf inside an exponent."),
        "everywhere": (
            "y is wrong everywhere. After the merge, does every lane hold the row's (m, l), or "
            "only its own?",
            "Step 2: the merge runs once per bit of the lane index, and each round updates both m "
            "and l in every lane; afterwards all 32 lanes agree on the row's m and l."),
    },
)


# ---- naive_softmax: attn_naive_softmax in kernels/attn_naive_fwd.cu --------------------------
def scores_inputs(case):
    """q, k, v; q and k shaped by the case's `scores` option as the flash exercises' are."""
    s = case.sizes
    q, k, v = fixed_normal(case.seed, (s["B"], s["H"], s["Nq"], s["d"]),
                           (s["B"], s["H"], s["Nk"], s["d"]), (s["B"], s["H"], s["Nk"], s["d"]))
    q, k = shaped_scores(case, q, k)
    return {"q": q, "k": k, "v": v}


def _scores(case, inputs):
    """S as attn_naive_scores writes it (fp32, -inf where masked): the softmax kernel's input."""
    q, k = inputs["q"].astype(np.float64), inputs["k"].astype(np.float64)
    d = case.sizes["d"]
    scale = case.options.get("scale") or 1 / np.sqrt(d)
    S = scale * (q @ np.swapaxes(k, -1, -2))
    if case.options.get("causal"):
        S = np.where(reference.causal_visible(case.sizes["Nq"], case.sizes["Nk"]), S, -np.inf)
    return S.astype(np.float32)


def naive_softmax_run(case, inputs):
    s, xp = case.sizes, device.xp()
    S = xp.asarray(_scores(case, inputs))
    P = poisoned(S.shape)
    f = device.load("attn_naive_fwd.cu").get_function("attn_naive_softmax")
    f((ceil_div(s["Nq"], SOFTMAX_ROWS), s["B"] * s["H"]), (WARP, SOFTMAX_ROWS),
      (S, P, np.int32(s["Nq"]), np.int32(s["Nk"])))
    O, _ = naive.naive_forward(*(xp.asarray(inputs[n]) for n in "qkv"),
                               causal=bool(case.options.get("causal")),
                               scale=case.options.get("scale"))
    return {"P": P, "O": O}


def naive_softmax_truth(case, inputs):
    P = softmax64(_scores(case, inputs))  # the kernel's own fp32 input, softmaxed in float64
    O, _ = reference.forward(inputs["q"], inputs["k"], inputs["v"],
                             causal=bool(case.options.get("causal")),
                             scale=case.options.get("scale"))
    return {"P": P, "O": O}


def attn_cases(big_keys: int = 70):
    return (
        _case("base", "the base case", B=1, H=2, Nq=20, Nk=64, d=16),
        _case("one_tile", "rows shorter than half the warp (Nk = 12)", B=1, H=2, Nq=20, Nk=12,
              d=16),
        _case("tail", "Nk not a multiple of 32", B=1, H=2, Nq=20, Nk=big_keys, d=16),
        _case("causal", "the causal mask", B=1, H=2, Nq=20, Nk=64, d=16, causal=True),
        _case("nq_gt_nk", "causal with rows that see no key (Nq > Nk)", B=1, H=2, Nq=40, Nk=20,
              d=16, causal=True),
    )


NAIVE_SOFTMAX = Exercise(
    name="naive_softmax", lab="02", title="the naive forward's softmax, writing P to HBM",
    kernel="attn_naive_fwd.cu",
    intro=("attn_naive_softmax: one warp per row i of S (B, H, Nq, Nk), lane j visiting the keys",
           "j, j + 32, ... You write each lane's running (m, l), the merge of the 32 lanes",
           "(lab 01's butterfly, here over a row of S) and the pass that writes P. Masked",
           "scores are -inf in S."),
    steps={
        1: StepText(("Each lane keeps the online softmax state of its keys (j = lane, lane + WARP,",
                     "...; s points at row i of S): m, the largest score seen so far, and l, the",
                     "sum of exp(S_ij - m) over them, brought to the new max (a factor e^(m_old -",
                     "m_new)) whenever m grows. Pitfall: masked scores are -inf; while everything",
                     "a lane has seen is -inf, -inf - (-inf) would be NaN: leave (m, l) as they",
                     "are until a finite score arrives. Updates: m, l."),
                    ()),
        2: StepText(("Merge the 32 lanes' (m, l) so that every lane holds the row's: lab 01's",
                     "butterfly, five rounds of a shuffle by xor, each lane keeping the larger max",
                     "and the sum of both sums brought to it. Pitfall: a lane that saw only -inf",
                     "(or no key: Nk < 32) has m = -inf and l = 0, and must add 0 to the merged",
                     "sum, not NaN. Updates: m, l, in every lane."),
                    ()),
        3: StepText(("P_ij = exp(S_ij - m_i) / l_i for the lane's keys j, written to row i of P",
                     "(it starts row * Nk elements into P, as s does into S); 1 / l once per row,",
                     "not a division per key. Pitfall: a row that sees no key (causal, Nq > Nk)",
                     "has m = -inf and l = 0: its P is 0, so it subtracts 0 instead of m and",
                     "scales by 0 instead of 1 / l (every S_ij is still read once, as the traffic",
                     "model counts)."),
                    ()),
    },
    outputs=(Output("P", ("b", "h", "i", "j"), {"i": SOFTMAX_ROWS, "j": WARP}),
             Output("O", ("b", "h", "i", "c"), {})),
    cases=attn_cases() + (
        _case("large", "large scores (softmax scale 20)", B=1, H=2, Nq=20, Nk=64, d=16,
              scale=20.0),
        _case("negative", "every score strongly negative (about -256: exp(S) underflows to 0 "
              "unless the row max is subtracted)", B=1, H=2, Nq=20, Nk=64, d=16,
              scores="negative"),
        _case("huge", "scores of magnitude up to about 1e4 (exp(S) overflows unless the row "
              "max is subtracted)", B=1, H=2, Nq=20, Nk=64, d=16, scores="huge")),
    inputs=scores_inputs, run=naive_softmax_run, truth=naive_softmax_truth,
    traffic=lambda case: [naive_traffic_of(case, "attn_naive_softmax")],
    kernels=("attn_naive_softmax",),
    picture=("attn_naive_softmax", ("P",)),
)


def naive_traffic_of(case, kernel: str):
    s = case.sizes
    runs = (traffic.naive_forward_traffic(s["B"], s["H"], s["Nq"], s["Nk"], s["d"])
            + traffic.naive_backward_traffic(s["B"], s["H"], s["Nq"], s["Nk"], s["d"]))
    return next(k for k in runs if k.kernel == kernel)


# ---- naive_ds: attn_naive_bwd_ds in kernels/attn_naive_bwd.cu ------------------------------
def ds_inputs(case):
    out = scores_inputs(case)
    s = case.sizes
    (out["dO"],) = fixed_normal(case.seed + 1, (s["B"], s["H"], s["Nq"], s["d"]))
    return out


def _p_dp(case, inputs):
    """P (the saved softmax, fp32) and dP = dO V^T (fp32): the dS kernel's inputs."""
    P, _ = reference.probabilities(inputs["q"], inputs["k"], bool(case.options.get("causal")))
    dP = inputs["dO"].astype(np.float64) @ np.swapaxes(inputs["v"].astype(np.float64), -1, -2)
    return P.astype(np.float32), dP.astype(np.float32)


def naive_ds_run(case, inputs):
    s, xp = case.sizes, device.xp()
    P, dP = (xp.asarray(a) for a in _p_dp(case, inputs))
    dS = poisoned(P.shape)
    f = device.load("attn_naive_bwd.cu").get_function("attn_naive_bwd_ds")
    f((ceil_div(s["Nq"], SOFTMAX_ROWS), s["B"] * s["H"]), (WARP, SOFTMAX_ROWS),
      (P, dP, dS, np.int32(s["Nq"]), np.int32(s["Nk"])))
    q, k, v, dO = (xp.asarray(inputs[n]) for n in ("q", "k", "v", "dO"))
    causal = bool(case.options.get("causal"))
    _, saved = naive.naive_forward(q, k, v, causal=causal)
    dQ, dK, dV = naive.naive_backward(dO, q, k, v, saved)
    return {"dS": dS, "dQ": dQ, "dK": dK, "dV": dV}


def naive_ds_truth(case, inputs):
    P, dP = (a.astype(np.float64) for a in _p_dp(case, inputs))  # the kernel's own inputs
    dS = P * (dP - (dP * P).sum(axis=-1, keepdims=True))
    dQ, dK, dV = reference.backward(inputs["dO"], inputs["q"], inputs["k"], inputs["v"],
                                    causal=bool(case.options.get("causal")))
    return {"dS": dS, "dQ": dQ, "dK": dK, "dV": dV}


def ds_slip(kind):
    """dS as a slip in the dS kernel forms it, from the kernel's own P and dP; dQ, dK, dV
    follow from that dS by the (given) matmul kernels: None where the check needs them."""
    def alt(case, inputs):
        P, dP = (a.astype(np.float64) for a in _p_dp(case, inputs))
        if kind == "not_reduced":  # each lane's D: its own keys j = lane, lane + 32, ...
            lane = np.arange(P.shape[-1]) % WARP
            D = np.stack([(dP * P)[..., lane == k].sum(axis=-1) for k in range(WARP)], -1)
            D = D[..., lane]
            dS = P * (dP - D)
        elif kind == "no_p_in_d":
            dS = P * (dP - dP.sum(axis=-1, keepdims=True))
        elif kind == "no_D":
            dS = P * dP
        else:  # "precedence": P dP - D
            dS = P * dP - (dP * P).sum(axis=-1, keepdims=True)
        return {"dS": dS} if case.label else None
    return alt


DS_SLIPS = {
    "not_reduced": ("P (dP - D) with each lane's own part of D, not the row's (the warp's sum "
                    "never taken)", ds_slip("not_reduced")),
    "no_p_in_d": ("P (dP - D) with D = sum_j dP_ij, the products with P left out",
                  ds_slip("no_p_in_d")),
    "no_D": ("P dP, with D left out", ds_slip("no_D")),
    "precedence": ("P dP - D: D subtracted after the product", ds_slip("precedence")),
}

NAIVE_DS = Exercise(
    name="naive_ds", lab="03", title="the store-P backward's dS = P * (dP - D)",
    kernel="attn_naive_bwd.cu",
    intro=("attn_naive_bwd_ds: the softmax's backward, one warp per row i, reading the stored P",
           "and dP = dO V^T from HBM. D_i = sum_j dP_ij P_ij equals rowsum(dO_i * O_i)."),
    steps={
        1: StepText(("D_i = sum_j dP_ij P_ij over the whole row i (it equals rowsum(dO_i * O_i)).",
                     "Each lane sums the terms of its keys (j = lane, lane + WARP, ...; row i",
                     "starts `row` elements into P and dP); the row's sum needs the 32 partial",
                     "sums added together, and every lane needs the total for step 2: a reduction",
                     "over the warp (common.cuh has one). Updates: D."),
                    ()),
        2: StepText(("dS_ij = P_ij (dP_ij - D_i) for the lane's keys, into dS at the place P and",
                     "dP are read from. Why: the softmax's Jacobian, diag(P_i) - P_i P_i^T,",
                     "applied to dP_i."),
                    ()),
    },
    outputs=(Output("dS", ("b", "h", "i", "j"), {"i": SOFTMAX_ROWS, "j": WARP}),
             Output("dQ", ("b", "h", "i", "c"), {}), Output("dK", ("b", "h", "j", "c"), {}),
             Output("dV", ("b", "h", "j", "c"), {})),
    cases=attn_cases(),
    inputs=ds_inputs, run=naive_ds_run, truth=naive_ds_truth,
    alternatives={**DS_SLIPS, "wrong_D": ("P (dP - D) with D from the wrong product",
                                          slips.ds_fitted_D(_p_dp))},
    traffic=lambda case: [naive_traffic_of(case, "attn_naive_bwd_ds")],
    kernels=("attn_naive_bwd_ds",),
    picture=("attn_naive_bwd_ds", ("dS",)),
    hints={
        ("dS", "everywhere"): (
            "dS is wrong everywhere. Is D the sum over the whole row, the same value in every "
            "lane, when dS is formed?",
            "Step 1: D_i sums over all of row i's keys, which 32 lanes share: their partial sums "
            "must be added across the warp, and the total reach every lane, before step 2 uses "
            "it."),
    },
)
