"""The FlashAttention exercises, cut from kernels/attn_flash_fwd.cu and attn_flash_bwd.cu: the
forward's online softmax (lab 04), the backward that recomputes P = exp(S - L) (lab 05) and the
dropout mask regenerated in the backward (lab 06).

They run through the lab's own wrappers (ckptlab.kernels.flash) with small tiles (16 x 16), so
that a few dozen rows already make several query and key tiles, a partial tail tile and a head
dim below the tile head dim (24 < 32).
"""

from __future__ import annotations

import numpy as np

from ckptlab import device, reference
from ckptlab.exercises.write import slips
from ckptlab.exercises.write.spec import Case, Exercise, Output, StepText, fixed_normal
from ckptlab.kernels import flash
from ckptlab.measure import traffic

TILES = (16, 16)  # (Br, Bc) of both kernels in the check: several tiles at small N
SEED, OFFSET = 1234, 7


def grid(extra=(), dropout_base: float = 0.0) -> tuple:
    """The cases: base, then one change each."""
    def case(label, phrase, Nq=32, Nk=32, d=32, H=2, **options):
        options.setdefault("causal", False)
        options.setdefault("dropout_p", dropout_base)
        return Case(label, phrase, dict(B=1, H=H, Nq=Nq, Nk=Nk, d=d), options,
                    seed=len(label) * 7919 + Nq * 31 + Nk)

    return (
        case("base", "the base case"),
        case("one_tile", "a single query tile and a single key tile", Nq=16, Nk=16),
        case("tail", "N not a multiple of the tile (a partial last tile)", Nq=37, Nk=37),
        case("causal", "the causal mask", causal=True),
        case("nq_lt_nk", "causal with more keys than queries (Nq < Nk)", Nq=20, Nk=37,
             causal=True),
        case("nq_gt_nk", "causal with rows that see no key (Nq > Nk)", Nq=37, Nk=20,
             causal=True),
        case("d_below", "a head dim below the tile head dim (d = 24, tiles 32 wide)", d=24),
        *extra(case),
    )


def qkv(case: Case):
    s = case.sizes
    q, k, v, dO = fixed_normal(case.seed, (s["B"], s["H"], s["Nq"], s["d"]),
                               (s["B"], s["H"], s["Nk"], s["d"]),
                               (s["B"], s["H"], s["Nk"], s["d"]),
                               (s["B"], s["H"], s["Nq"], s["d"]))
    return {"q": q, "k": k, "v": v, "dO": dO}


def _options(case: Case) -> dict:
    o = case.options
    return dict(causal=o["causal"], scale=o.get("scale"), dropout_p=o["dropout_p"],
                seed=o.get("seed", SEED), offset=o.get("offset", OFFSET))


def _device(inputs):
    xp = device.xp()
    return {k: xp.asarray(v) for k, v in inputs.items()}


# ---- what a slip computes instead -----------------------------------------------------------
def _mask(case, Nq, Nk, kind):
    if not case.options["causal"] or kind is None:
        return np.ones((Nq, Nk), dtype=bool)
    i, j = np.arange(Nq)[:, None], np.arange(Nk)[None, :]
    return j <= i + (Nk - Nq if kind == "bottom_right" else 0)


def slipped(case, inputs, *, mask="bottom_right", scale=None, dropout=True, z_in_dv=True,
            z_in_dp=True, use_D=True) -> dict:
    """What the kernels compute with one slip, in float64: the forward's O and L, and the
    backward's dQ, dK, dV as the backward kernel would form them, recomputing P = exp(S - L)
    from the true L and using the true D = rowsum(dO * O) (both come from the shipped forward)
    with the slip applied only inside the backward."""
    q, k, v, dO = (inputs[n].astype(np.float64) for n in ("q", "k", "v", "dO"))
    o = _options(case)
    Nq, Nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    true_scale = o["scale"] or 1 / np.sqrt(d)
    scale = true_scale if scale is None else scale
    O_true, L_true = reference.forward(*(inputs[n] for n in "qkv"), **o)
    S = scale * (q @ np.swapaxes(k, -1, -2))
    seen = _mask(case, Nq, Nk, mask)
    Z = (reference.dropout_factor((*q.shape[:2], Nq, Nk), o["dropout_p"], o["seed"],
                                  o["offset"]) if dropout else np.ones((*q.shape[:2], Nq, Nk)))
    # the forward with the slip: a softmax over the visible scores
    Sm = np.where(seen, S, -np.inf)
    m = Sm.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    E = np.exp(Sm - m)
    l = E.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        L = np.where(l > 0, m + np.log(l), np.inf)[..., 0]
    O = (E / np.where(l > 0, l, 1.0) * Z) @ v
    # the backward with the slip: P from the true L, D from the true O
    with np.errstate(invalid="ignore", over="ignore"):
        P = np.where(seen & np.isfinite(L_true)[..., None], np.exp(S - L_true[..., None]), 0.0)
    D = (dO * O_true).sum(axis=-1, keepdims=True) if use_D else 0.0
    dV = np.swapaxes(P * (Z if z_in_dv else 1.0), -1, -2) @ dO
    dS = P * ((dO @ np.swapaxes(v, -1, -2)) * (Z if z_in_dp else 1.0) - D)
    return {"O": O, "L": L, "dQ": true_scale * (dS @ k),
            "dK": true_scale * (np.swapaxes(dS, -1, -2) @ q), "dV": dV}


def _when(condition, **kw):
    """An alternative truth, used only in the cases where `condition(options)` holds."""
    def alt(case, inputs):
        return slipped(case, inputs, **kw) if condition(_options(case)) else None
    return alt


SLIPS = {
    "top_left": ("the causal mask aligned to the top-left corner (j <= i)",
                 _when(lambda o: o["causal"], mask="top_left")),
    "no_mask": ("attention without the causal mask", _when(lambda o: o["causal"], mask=None)),
    "no_scale": ("what the scores give with the softmax scale left out (scale = 1)",
                 _when(lambda o: True, scale=1.0)),
    "no_dropout": ("what the kernel gives without dropout (the mask never applied)",
                   _when(lambda o: o["dropout_p"] > 0, dropout=False)),
}
BACKWARD_SLIPS = {**SLIPS, "no_D": ("the gradients with D left out of dS = P (dP - D)",
                                    _when(lambda o: True, use_D=False))}


# ---- the forward ---------------------------------------------------------------------------
def run_forward(case, inputs):
    a = _device(inputs)
    O, saved = flash.flash_forward(a["q"], a["k"], a["v"], **_options(case), tiles=TILES)
    return {"O": O, "L": saved.tensors["L"]}


def truth_forward(case, inputs):
    O, L = reference.forward(inputs["q"], inputs["k"], inputs["v"], **_options(case))
    return {"O": O, "L": L}


def traffic_forward(case):
    s = case.sizes
    return traffic.flash_forward_traffic(s["B"], s["H"], s["Nq"], s["Nk"], s["d"],
                                         case.options["causal"], *TILES)


ROWS = {"i": TILES[0]}

FLASH_FORWARD = Exercise(
    name="flash_forward", lab="04", title="the FlashAttention forward's online softmax",
    kernel="attn_flash_fwd.cu",
    intro=("One block owns Br query rows and streams the key tiles through shared memory; row",
           "group r (LANES threads) owns query i = q0 + r. You write what each row does with a",
           "tile: its scores, the online softmax (m, l), the accumulator, and the end: O and L."),
    steps={
        1: StepText(("S_ij = scale * (q_i . k_j) where query i sees key j (in range, and when",
                     "causal j <= i + Nk - Nq), else -INFINITY. `dot` holds q_i . k_j.",
                     "Defines: seen (bool: does i see j), s[c]."),
                    ("const bool seen = false;", "s[c] = -INFINITY;")),
        2: StepText(("m_new = max(m, the tile's row max) (group_max<LANES> over the row group);",
                     "alpha = exp(m - m_new) rescales what was summed under the old max;",
                     "p = exp(S_ij - m_new); Ps[r][jj] = p * dropout factor (p > 0:",
                     "dropout_factor(drop, (bh * Nq + i) * Nk + j), else 0);",
                     "l = alpha * l + the tile's sum of p (group_sum<LANES>); then m = m_new.",
                     "A row that has seen only -inf has m_new = -inf: subtract 0 then, not -inf.",
                     "Defines: alpha. Updates: m, l, Ps."),
                    ("const float alpha = 1.0f;",)),
        3: StepText(("acc[c] = alpha * acc[c] + sum over the tile's keys jj of Ps[r][jj] *",
                     "Vs[jj][col], for this lane's columns col = lane + c * LANES.",),
                    ()),
        4: StepText(("O_i = acc / l for this lane's columns col < d (a row that saw no key,",
                     "l = 0: O = 0); lane 0 writes L_i = m + log l (no key: +INFINITY)."), ()),
    },
    outputs=(Output("O", ("b", "h", "i", "c"), ROWS), Output("L", ("b", "h", "i"), ROWS)),
    cases=grid(lambda case: (
        case("large", "large scores (softmax scale 20: exp of a raw score overflows)",
             scale=20.0),
        case("dropout", "dropout (p = 0.2)", dropout_p=0.2),
    )),
    inputs=qkv, run=run_forward, truth=truth_forward, traffic=traffic_forward,
    alternatives={**SLIPS, "scale_squared": slips.scale_squared(slipped)},
    hints={
        "multi_tile": (
            "O is right with one key tile and wrong with several. When a later tile raises a "
            "row's max, what happens to what that row summed before?",
            "Steps 2 and 3: l and acc were summed against the old max m; under m_new each must "
            "be multiplied by alpha = exp(m - m_new) before this tile's terms are added."),
        ("L", "everywhere"): (
            "L is wrong where O may be right. What is L, in terms of the row's max and sum?",
            "Step 4: L_i = m_i + log(l_i), the logsumexp of the row's scores (natural log), "
            "with m and l as they stand after the last tile."),
        ("L", "factor"): (
            "L is off by a constant factor. Is it the log of the sum, plus the max?",
            "Step 4: L_i = m_i + log(l_i): log, not log2 or a product."),
        ("O", "factor"): (
            "O is off by one factor everywhere. Is the accumulator normalised by the row's "
            "sum, and are the scores scaled?",
            "Step 1 scales the dot product by `scale`; step 4 divides acc by l once."),
    },
    kernels=("attn_flash_fwd",),
    picture=("attn_flash_fwd", ("O", "L")),
)


# ---- the backward --------------------------------------------------------------------------
def run_backward(case, inputs):
    """The shipped forward, then the backward of the file being checked."""
    a = _device(inputs)
    _, saved = flash.flash_forward(a["q"], a["k"], a["v"], **_options(case), tiles=TILES)
    dQ, dK, dV = flash.flash_backward(a["dO"], a["q"], a["k"], a["v"], saved, tiles=TILES)
    return {"dQ": dQ, "dK": dK, "dV": dV}


def truth_backward(case, inputs):
    dQ, dK, dV = reference.backward(inputs["dO"], inputs["q"], inputs["k"], inputs["v"],
                                    **_options(case))
    return {"dQ": dQ, "dK": dK, "dV": dV}


def traffic_backward(case):
    s = case.sizes
    return traffic.flash_backward_traffic(s["B"], s["H"], s["Nq"], s["Nk"], s["d"],
                                          case.options["causal"], False, *TILES)


GRADS = (Output("dQ", ("b", "h", "i", "c"), {"i": TILES[0]}),
         Output("dK", ("b", "h", "j", "c"), {"j": TILES[1]}),
         Output("dV", ("b", "h", "j", "c"), {"j": TILES[1]}))

FLASH_BACKWARD = Exercise(
    name="flash_backward", lab="05",
    title="the backward that recomputes P = exp(S - L) tile by tile",
    kernel="attn_flash_bwd.cu",
    intro=("attn_flash_bwd_dkdv: one block owns Bc keys (row group y owns key j = k0 + y) and",
           "loops over the query tiles; for each entry (i, j) of a tile pair you recompute S and",
           "P from L, form dP and dS, and accumulate dK_j, dV_j; dQ_i goes to global memory,",
           "where every K/V block adds its part. D_i = rowsum(dO_i * O_i) is given (preprocess)."),
    steps={
        1: StepText(("S_ij = scale * q_i . k_j, recomputed from the tiles in shared memory",
                     "(row_dot<Dt>(Qs[ii], Ks[y]); keep STORED's branch: S_ij = Pds[ii][y]);",
                     "dpd = dO_i . V_j (row_dot_split<Dt>(dOs[ii], Vs[y])), the dP before",
                     "dropout; P_ij = exp(S_ij - L_i) where i sees j (visible(i, j, Nq, Nk,",
                     "causal)), else 0. L_i is Ls[ii]. Defines: s, dpd, p."),
                    ("const float s = STORED ? Pds[ii][y] : 0.0f;", "const float dpd = 0.0f;",
                     "const float p = 0.0f;")),
        2: StepText(("dP_ij = dpd * z (z = Z_ij / (1 - p) is given above). Write the dropped P",
                     "for dV, Pds[ii][y] = P_ij * z, and dSs[ii][y] = P_ij * (dP_ij - D_i),",
                     "D_i = Ds[ii]."),
                    ()),
        3: StepText(("For this thread's columns col = lane + c * LANES, over the tile's rows ii:",
                     "dv[c] += sum_ii Pds[ii][y] * dOs[ii][col]  (dV_j += P_dropped^T dO)",
                     "dk[c] += sum_ii dSs[ii][y] * Qs[ii][col]   (dK_j += dS^T Q; the scale is",
                     "applied once, where dK is stored below)."), ()),
        4: StepText(("dQ_i += scale * sum_jj dSs[ii][jj] * Ks[jj][col] for the rows",
                     "ii = y, y + Bc, ... of this Q tile with q0 + ii < Nq, and the columns",
                     "col = lane + c * LANES < d. Other K/V blocks add to the same dQ_i at the",
                     "same time (dQ was zeroed by the preprocess kernel)."), ()),
    },
    outputs=GRADS,
    cases=grid(lambda case: (
        case("large", "large scores (softmax scale 20)", scale=20.0),
        case("dropout", "dropout (p = 0.2)", dropout_p=0.2),
    )),
    inputs=qkv, run=run_backward, truth=truth_backward, traffic=traffic_backward,
    alternatives={**BACKWARD_SLIPS, "scale_squared": slips.scale_squared(slipped),
                  **slips.backward_slips(_options, _mask)},
    hints={
        ("dQ", "multi_tile"): (
            "dQ is right when a single K/V block runs and wrong when several do. How do the "
            "contributions of different blocks to the same dQ row combine?",
            "Step 4: every K/V block adds its scale * dS_ij K_j to the same dQ_i, at the same "
            "time as the others: a plain store keeps only one block's part; add atomically."),
        ("dK", "multi_tile"): (
            "dK is right with one query tile and wrong with several. Across the loop over query "
            "tiles, is dk accumulated or overwritten?",
            "Step 3: dk[c] and dv[c] sum over every query tile: += the tile's sum."),
        ("dV", "multi_tile"): (
            "dV is right with one query tile and wrong with several. Across the loop over query "
            "tiles, is dv accumulated or overwritten?",
            "Step 3: dv[c] sums P_dropped^T dO over every query tile: += the tile's sum."),
        ("dQ", "factor"): (
            "dQ is off by a constant factor. Which factor does S = scale * Q K^T put in front "
            "of dQ?",
            "Step 4: dQ_i += scale * sum_j dS_ij K_j: the scale once, as dK has it."),
        ("dV", "everywhere"): (
            "dV is wrong everywhere. Is P recomputed against the right L, and is it P (not "
            "dS) that meets dO?",
            "Steps 1-3: P_ij = exp(S_ij - L_i) with S_ij = scale * q_i . k_j; dV_j = sum_i "
            "P_dropped_ij dO_i."),
        ("dK", "everywhere"): (
            "dK is wrong where dV is right. Which of the two tiles in shared memory does dK "
            "need, and which row of it?",
            "Steps 2-3: dS_ij = P_ij (dP_ij - D_i), and dK_j += dS_ij Q_i over the rows i."),
    },
    kernels=("attn_flash_bwd_dkdv", "attn_flash_bwd_preprocess"),
    picture=("attn_flash_bwd_dkdv", ("dQ", "dK", "dV")),
)


def dropout_grid(case):
    """Dropout on in every case (p = 0.2): the mask must be the forward's, everywhere."""
    return (case("other_seed", "another seed and offset (seed 99, offset 5)", seed=99,
                 offset=5),
            case("high_p", "a higher dropout rate (p = 0.6)", dropout_p=0.6))


DROPOUT_BACKWARD = Exercise(
    name="dropout_backward", lab="06",
    title="the dropout mask regenerated in the backward, from (seed, offset)",
    kernel="attn_flash_bwd.cu",
    intro=("The forward dropped P_ij with Z_ij from Philox at (seed, offset) and the element's",
           "index; nothing was stored. The backward must draw the very same Z_ij again, and",
           "apply it where the forward did. Every case here runs with dropout."),
    steps={
        1: StepText(("z = Z_ij / (1 - p) for this (i, j): dropout_factor(drop, index) with the",
                     "index the forward used, the element's position in a contiguous",
                     "(B, H, Nq, Nk) array; 0 where P_ij = 0 (masked: no word drawn).",
                     "Defines: z."),
                    ("const float z = 1.0f;",)),
        2: StepText(("Where Z enters: dV needs the dropped P (O = P_dropped V), and dP, the",
                     "gradient reaching the undropped P, is (dO_i . V_j) * z (dpd holds",
                     "dO_i . V_j).",
                     "The lines below are the no-dropout version: make them right with dropout."),
                    ("Pds[ii][y] = p;", "dSs[ii][y] = p * (dpd - Ds[ii]);")),
    },
    outputs=GRADS,
    cases=grid(dropout_grid, dropout_base=0.2),
    inputs=qkv, run=run_backward, truth=truth_backward, traffic=traffic_backward,
    alternatives={
        "no_dropout": SLIPS["no_dropout"],
        "z_not_in_dp": ("the gradients with Z applied to dV but not to dP",
                        _when(lambda o: True, z_in_dp=False)),
        "z_not_in_dv": ("the gradients with Z applied to dP but not to P in dV",
                        _when(lambda o: True, z_in_dv=False)),
        **{k: v for k, v in slips.backward_slips(_options, _mask).items()
           if k.startswith("wrong_D")},
    },
    hints={
        "everywhere": (
            "The gradients are wrong everywhere. Is the mask of the backward the mask the "
            "forward drew: the same function, seed, offset and index?",
            "Step 1: z = dropout_factor(drop, (bh * Nq + i) * Nk + j), the forward's own call "
            "(attn_flash_fwd.cu); step 2: Pds = p * z, dS = p * (dpd * z - D)."),
        ("dV", "factor"): (
            "dV is off by one factor. Is the kept P scaled by 1 / (1 - p), as the forward's?",
            "dropout_factor already returns Z / (1 - p): multiply by it once."),
    },
    kernels=("attn_flash_bwd_dkdv",),
    picture=("attn_flash_bwd_dkdv", ("dQ", "dK", "dV")),
)
