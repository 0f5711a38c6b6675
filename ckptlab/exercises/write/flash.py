"""The FlashAttention exercises, cut from kernels/attn_flash_fwd.cu and attn_flash_bwd.cu: the
forward's online softmax (lab 04), the backward that recomputes P = exp(S - L) (lab 05) and the
dropout mask regenerated in the backward (lab 06).

They run through the lab's own wrappers (ckptlab.kernels.flash) with small tiles (16 x 16), so
that a few dozen rows already make several query and key tiles, a partial tail tile and a head
dim below the tile head dim (24 < 32). What the learner reads, the steps' notes and the hints,
is in flash_text.py.
"""

from __future__ import annotations

import numpy as np

from ckptlab import device, reference
from ckptlab.exercises.write.flash_text import (
    BACKWARD_HINTS,
    BACKWARD_STEPS,
    DROPOUT_HINTS,
    DROPOUT_STEPS,
    FORWARD_HINTS,
    FORWARD_STEPS,
)
from ckptlab.exercises.write.spec import Case, Exercise, Output, fixed_normal
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
    steps=FORWARD_STEPS,
    outputs=(Output("O", ("b", "h", "i", "c"), ROWS), Output("L", ("b", "h", "i"), ROWS)),
    cases=grid(lambda case: (
        case("large", "large scores (softmax scale 20: exp of a raw score overflows)",
             scale=20.0),
        case("dropout", "dropout (p = 0.2)", dropout_p=0.2),
    )),
    inputs=qkv, run=run_forward, truth=truth_forward, traffic=traffic_forward,
    alternatives=SLIPS,
    hints=FORWARD_HINTS,
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
           "where every K/V block adds its part (steps 1-4). attn_flash_bwd_dq, the deterministic",
           "dQ, forms P and dS a second time, one block per Q tile, and writes dQ once with no",
           "atomics (steps 5-7). D_i = rowsum(dO_i * O_i) is given (preprocess)."),
    steps=BACKWARD_STEPS,
    outputs=GRADS,
    cases=grid(lambda case: (
        case("large", "large scores (softmax scale 20)", scale=20.0),
        case("dropout", "dropout (p = 0.2)", dropout_p=0.2),
    )),
    inputs=qkv, run=run_backward, truth=truth_backward, traffic=traffic_backward,
    alternatives=BACKWARD_SLIPS,
    hints=BACKWARD_HINTS,
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
           "apply it where the forward did: in the dK/dV kernel (steps 1-2) and in the",
           "deterministic dQ kernel (step 3). Every case here runs with dropout."),
    steps=DROPOUT_STEPS,
    outputs=GRADS,
    cases=grid(dropout_grid, dropout_base=0.2),
    inputs=qkv, run=run_backward, truth=truth_backward, traffic=traffic_backward,
    alternatives={
        "no_dropout": SLIPS["no_dropout"],
        "z_not_in_dp": ("the gradients with Z applied to dV but not to dP",
                        _when(lambda o: True, z_in_dp=False)),
        "z_not_in_dv": ("the gradients with Z applied to dP but not to P in dV",
                        _when(lambda o: True, z_in_dv=False)),
    },
    hints=DROPOUT_HINTS,
    kernels=("attn_flash_bwd_dkdv",),
    picture=("attn_flash_bwd_dkdv", ("dQ", "dK", "dV")),
)
