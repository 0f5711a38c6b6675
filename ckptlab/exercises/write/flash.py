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
from ckptlab.exercises.write import slips
from ckptlab.exercises.write.flash_cases import (
    TILES,
    cases_of,
    grid,
    on_device,
    options,
    qkv,
    score_cases,
)
from ckptlab.exercises.write.flash_text import (
    BACKWARD_HINTS,
    BACKWARD_STEPS,
    DROPOUT_HINTS,
    DROPOUT_STEPS,
    FORWARD_HINTS,
    FORWARD_STEPS,
)
from ckptlab.exercises.write.spec import Exercise, Output
from ckptlab.kernels import flash, stored
from ckptlab.kernels.common import still_poison
from ckptlab.measure import traffic

# the wrappers of each method: flash (STORED = false) and stored (STORED = true)
FORWARDS = {False: flash.flash_forward, True: stored.stored_forward}
BACKWARDS = {False: flash.flash_backward, True: stored.stored_backward}


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
    o = options(case)
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
        return slipped(case, inputs, **kw) if condition(options(case)) else None
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
def _visible(case) -> np.ndarray:
    """(Nq, Nk) bool: which scores the mask lets through (every one without causal)."""
    return _mask(case, case.sizes["Nq"], case.sizes["Nk"], "bottom_right")


def run_forward(case, inputs):
    """The file's forward through the wrappers of the case's method (flash, or stored: S too,
    its masked entries -inf where the kernel left them unwritten, as the backward reads them)."""
    a = on_device(inputs)
    is_stored = bool(case.options.get("stored"))
    O, saved = FORWARDS[is_stored](a["q"], a["k"], a["v"], **options(case), tiles=TILES)
    out = {"O": O, "L": saved.tensors["L"]}
    if is_stored:
        S = np.array(device.to_numpy(saved.tensors["S"]))
        S[~_visible(case) & still_poison(S)] = -np.inf
        out["S"] = S
    return out


def truth_forward(case, inputs):
    O, L = reference.forward(inputs["q"], inputs["k"], inputs["v"], **options(case))
    out = {"O": O, "L": L}
    if case.options.get("stored"):
        q, k = inputs["q"].astype(np.float64), inputs["k"].astype(np.float64)
        scale = options(case)["scale"] or 1 / np.sqrt(q.shape[-1])
        out["S"] = np.where(_visible(case), scale * (q @ np.swapaxes(k, -1, -2)), -np.inf)
    return out


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
    # S: the stored instantiation's only (the scores it writes for the backward)
    outputs=(Output("O", ("b", "h", "i", "c"), ROWS), Output("L", ("b", "h", "i"), ROWS),
             Output("S", ("b", "h", "i", "j"), {"i": TILES[0], "j": TILES[1]})),
    cases=cases_of("attn_flash_fwd.cu", grid(lambda case: (
        case("large", "large scores (softmax scale 20: exp of a raw score overflows)",
             scale=20.0),
        case("dropout", "dropout (p = 0.2)", dropout_p=0.2),
        *score_cases(case),
    ))),
    inputs=qkv, run=run_forward, truth=truth_forward, traffic=traffic_forward,
    alternatives={**SLIPS, "scale_squared": slips.scale_squared(slipped)},
    hints=FORWARD_HINTS,
    kernels=("attn_flash_fwd",),
    picture=("attn_flash_fwd", ("O", "L")),
)


# ---- the backward --------------------------------------------------------------------------
def run_backward(case, inputs):
    """The shipped forward of the case's method, then the backward of the file being checked
    (stored or flash, dQ by atomics or by the deterministic kernel)."""
    a = on_device(inputs)
    is_stored = bool(case.options.get("stored"))
    _, saved = FORWARDS[is_stored](a["q"], a["k"], a["v"], **options(case), tiles=TILES)
    dQ, dK, dV = BACKWARDS[is_stored](a["dO"], a["q"], a["k"], a["v"], saved, tiles=TILES,
                                      deterministic=bool(case.options.get("deterministic")))
    return {"dQ": dQ, "dK": dK, "dV": dV}


def truth_backward(case, inputs):
    dQ, dK, dV = reference.backward(inputs["dO"], inputs["q"], inputs["k"], inputs["v"],
                                    **options(case))
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
    cases=cases_of("attn_flash_bwd.cu", grid(lambda case: (
        case("large", "large scores (softmax scale 20)", scale=20.0),
        case("dropout", "dropout (p = 0.2)", dropout_p=0.2),
        *score_cases(case, huge=False),
    ))),
    inputs=qkv, run=run_backward, truth=truth_backward, traffic=traffic_backward,
    alternatives={**BACKWARD_SLIPS, "scale_squared": slips.scale_squared(slipped),
                  **slips.backward_slips(options, _mask)},
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
    cases=cases_of("attn_flash_bwd.cu", grid(dropout_grid, dropout_base=0.2)),
    inputs=qkv, run=run_backward, truth=truth_backward, traffic=traffic_backward,
    alternatives={
        "no_dropout": SLIPS["no_dropout"],
        "z_not_in_dp": ("the gradients with Z applied to dV but not to dP",
                        _when(lambda o: True, z_in_dp=False)),
        "z_not_in_dv": ("the gradients with Z applied to dP but not to P in dV",
                        _when(lambda o: True, z_in_dv=False)),
        **{k: v for k, v in slips.backward_slips(options, _mask).items()
           if k.startswith("wrong_D")},
    },
    hints=DROPOUT_HINTS,
    kernels=("attn_flash_bwd_dkdv",),
    picture=("attn_flash_bwd_dkdv", ("dQ", "dK", "dV")),
)
