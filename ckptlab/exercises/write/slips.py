"""More of what a slip computes instead, in float64: the scale applied twice, an index swapped
inside a tile (P read as P^T, the roles of Q and K exchanged), D taken from the wrong
quantity, and a wmma fragment loaded with the wrong leading dimension.

Each function here is an exercise's alternative truth: (case, inputs) -> dict of outputs, or
None where the slip changes nothing in the case (spec.Exercise.alternatives).
"""

from __future__ import annotations

import numpy as np

from ckptlab import reference

TILE = 16  # the square tiles of the flash exercises (flash.TILES) and of wmma


def tile_transposed(x: np.ndarray, t: int = TILE) -> np.ndarray:
    """x (..., R, C) with every t x t tile transposed in place (zeros past R and C): what a
    kernel reads when it swaps the two indices of a square shared-memory tile."""
    *lead, R, C = x.shape
    Rp, Cp = -(-R // t) * t, -(-C // t) * t
    padded = np.zeros((*lead, Rp, Cp))
    padded[..., :R, :C] = x
    tiles = padded.reshape(*lead, Rp // t, t, Cp // t, t)
    return np.swapaxes(tiles, -1, -3).reshape(*lead, Rp, Cp)[..., :R, :C]


def backward_slips(options, mask) -> dict:
    """The flash backward's slips in its own steps (pattern -> (what, truth)); `options` and
    `mask` are flash.py's (a case's launch options, its visibility mask)."""
    def grads(case, inputs, *, swap_s=False, swap_p_dv=False, swap_ds_dk=False, D=None):
        """dQ, dK, dV as the backward kernel forms them (P from the true L, the true D unless
        `D` names another: "L" or "own term"), with one slip."""
        q, k, v, dO = (inputs[n].astype(np.float64) for n in ("q", "k", "v", "dO"))
        o = options(case)
        Nq, Nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
        scale = o["scale"] or 1 / np.sqrt(d)
        O_true, L_true = reference.forward(*(inputs[n] for n in "qkv"), **o)
        S = scale * (q @ np.swapaxes(k, -1, -2))
        if swap_s:
            S = tile_transposed(S)
        seen = mask(case, Nq, Nk, "bottom_right")
        Z = reference.dropout_factor((*q.shape[:2], Nq, Nk), o["dropout_p"], o["seed"],
                                     o["offset"])
        with np.errstate(invalid="ignore", over="ignore"):
            P = np.where(seen & np.isfinite(L_true)[..., None], np.exp(S - L_true[..., None]),
                         0.0)
        dP = (dO @ np.swapaxes(v, -1, -2)) * Z
        if D == "L":
            Dv = np.where(np.isfinite(L_true), L_true, 0.0)[..., None]
        elif D == "own term":
            Dv = P * dP
        else:
            Dv = (dO * O_true).sum(axis=-1, keepdims=True)
        dS = P * (dP - Dv)
        Pd = P * Z
        dV = np.swapaxes(tile_transposed(Pd) if swap_p_dv else Pd, -1, -2) @ dO
        dK = scale * (np.swapaxes(tile_transposed(dS) if swap_ds_dk else dS, -1, -2) @ q)
        return {"dQ": scale * (dS @ k), "dK": dK, "dV": dV}

    def slip(**kw):
        return lambda case, inputs: grads(case, inputs, **kw)

    return {
        "swap_p_dv": ("the gradients with P in place of P^T in dV (each tile's P read as "
                      "P[j][i]: an index swap)", slip(swap_p_dv=True)),
        "swap_qk": ("the gradients with the roles of Q and K swapped in S (each tile's S read "
                    "transposed: an index swap)", slip(swap_s=True)),
        "swap_ds_dk": ("the gradients with dS in place of dS^T in dK (an index swap)",
                       slip(swap_ds_dk=True)),
        "wrong_D_L": ("the gradients with L_i where D_i belongs in dS = P (dP - D): D from the "
                      "wrong quantity", slip(D="L")),
        "wrong_D_term": ("the gradients with D_i replaced by this entry's own P_ij dP_ij: one "
                         "term of D's row sum, not the sum", slip(D="own term")),
    }


def scale_squared(slipped) -> tuple:
    """The alternative "the scores scaled twice": `slipped` is flash.py's (a case's outputs with
    one slip, here the scale)."""
    def alt(case, inputs):
        scale = case.options.get("scale") or 1 / np.sqrt(case.sizes["d"])
        return slipped(case, inputs, scale=scale * scale)
    return ("what attention gives with the scores scaled twice (scale^2 q . k inside the "
            "softmax)", alt)


# ---- naive_ds: D fitted from the learner's dS -------------------------------------------------
def ds_fitted_D(p_dp):
    """An alternative for naive_ds that fits D to the learner's dS: when dS = P (dP - D') with
    one D' per row that is not the true D, it is "D from the wrong product", and the message
    names the product D' equals where it is one a slip makes."""
    def alt(case, inputs, mine):
        P, dP = (a.astype(np.float64) for a in p_dp(case, inputs))
        dS = np.asarray(mine["dS"], np.float64)
        use = P > 1e-3
        with np.errstate(all="ignore"):
            Dfit = np.where(use, dP - dS / np.where(use, P, 1.0), np.nan)
        D = np.nanmedian(np.where(use.any(axis=-1, keepdims=True), Dfit, 0.0), axis=-1,
                         keepdims=True)
        if not np.isfinite(D).all():
            return None
        named = {"sum_j dP_ij (no P)": dP.sum(-1, keepdims=True),
                 "sum_j P_ij (no dP)": P.sum(-1, keepdims=True),
                 "sum_j dP_ij^2": (dP * dP).sum(-1, keepdims=True),
                 "sum_j P_ij^2": (P * P).sum(-1, keepdims=True),
                 "0": np.zeros_like(D)}
        what = next((f"D = {n}" for n, ref in named.items()
                     if np.allclose(D, ref, rtol=1e-3, atol=1e-4)), "another row quantity")
        return {"dS": P * (dP - D),
                "_what": f"P (dP - D) with one D per row, but not sum_j P_ij dP_ij: {what} "
                         "(D from the wrong product)"}
    alt.fits = True
    return alt


# ---- wmma_tile: a fragment loaded with the wrong leading dimension -------------------------
def wmma_wrong_ld(which: str, ld: int):
    """C when fragment `which` ("a" or "b") is loaded with leading dimension `ld` from its
    16 x 16 tile (row r read at r * ld): None where that reaches past the tile (a fault)."""
    def alt(case, arrays):
        if 15 * ld + 15 >= TILE * TILE:
            return None
        A, B = (arrays[n].astype(np.float64) for n in ("A", "B"))
        M, K = A.shape
        N = B.shape[1]
        pad = lambda x, r, c: np.pad(x, ((0, -(-r // TILE) * TILE - r),  # noqa: E731
                                         (0, -(-c // TILE) * TILE - c)))
        Ap, Bp = pad(A, M, K), pad(B, K, N)
        idx = (np.arange(TILE)[:, None] * ld + np.arange(TILE)[None, :])
        C = np.zeros((Ap.shape[0], Bp.shape[1]))
        for r0 in range(0, Ap.shape[0], TILE):
            for c0 in range(0, Bp.shape[1], TILE):
                for k0 in range(0, Ap.shape[1], TILE):
                    a = Ap[r0:r0 + TILE, k0:k0 + TILE]
                    b = Bp[k0:k0 + TILE, c0:c0 + TILE]
                    if which == "a":
                        a = a.reshape(-1)[idx]
                    else:
                        b = b.reshape(-1)[idx]
                    C[r0:r0 + TILE, c0:c0 + TILE] += a @ b
        return {"C": C[:M, :N]}
    return alt


WMMA_SLIPS = {
    f"ld_{w}_{ld}": (f"A B with the fragment {w} loaded with leading dimension {ld} (its tile, "
                     f"{'As' if w == 'a' else 'Bs'}, has rows of 16): the tile read with another "
                     "shape", wmma_wrong_ld(w, ld))
    for w in ("a", "b") for ld in (8,)}
