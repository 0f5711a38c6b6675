"""The cases of the FlashAttention exercises: the launch configurations (one change each from
base), the inputs of each (the scores' range chosen through q and k), and the instantiations of
the learner's file the wrappers can launch, each run as a variant.

The inputs of the "negative" and "huge" cases are built so that q . k is exact in fp32 in any
order of summation: entries that are multiples of 1/8 (times a power of two), whose products
and partial sums need at most 21 significant bits. The only rounding left is scale * (q . k)
itself, half an ulp of S, so a kernel that subtracts the row max is within the check's
tolerance however it orders its sums, while one that does not underflows or overflows.
"""

from __future__ import annotations

import re

import numpy as np

from ckptlab import device
from ckptlab.exercises.write.spec import Case, Variant, fixed_normal, with_variants
from ckptlab.kernels.table import instantiations, tile_head_dim

TILES = (16, 16)  # (Br, Bc) of both kernels in the check: several tiles at small N
SEED, OFFSET = 1234, 7
# the "negative" case: q_i and k_j share one coordinate, +A in q and -A in k, so every score is
# scale * (-A^2 + x_i . y_j), about -181 at d = 32: exp(S) is 0 in fp32 below -104
NEGATIVE_A = 32.0
# the "huge" case: q and k are the quantised normals times HUGE_GAIN, so |S| reaches about 1e4
HUGE_GAIN = 64.0


def grid(extra=None, dropout_base: float = 0.0) -> tuple:
    """The default instantiation's cases: base, then one change each (`extra(case)` adds the
    exercise's own)."""
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
        *(extra(case) if extra else ()),
    )


def score_cases(case, huge: bool = True) -> tuple:
    """Scores far from 0 in both directions, through q and k alone (scale unchanged). Without
    `huge` for the backward: at |S| ~ 1e4 nearly every row's P is one-hot, so dS = P (dP - D)
    is 0 up to rounding in float64 and the gradients have no scale to be compared against."""
    negative = case("negative", "every score strongly negative (about -180: exp(S) underflows "
                    "to 0 unless the row max is subtracted)", scores="negative")
    return (negative, case("huge", "scores of magnitude up to about 1e4 (exp(S) overflows "
                           "unless the row max is subtracted)", scores="huge"))[:1 + huge]


def _quantised(g, shape) -> np.ndarray:
    """Standard normals rounded to multiples of 1/8, within [-4, 4]."""
    return np.clip(np.round(g.standard_normal(shape) * 8) / 8, -4, 4).astype(np.float32)


def shaped_scores(case: Case, q: np.ndarray, k: np.ndarray) -> tuple:
    """(q, k) as the case's `scores` option wants them: as given without it; "negative": every
    score about -A^2 * scale; "huge": scores up to about 1e4 (exact dots, see above)."""
    scores = case.options.get("scores")
    if scores is None:
        return q, k
    g = np.random.default_rng(case.seed + 1)
    q, k = _quantised(g, q.shape), _quantised(g, k.shape)
    if scores == "negative":
        q[..., -1], k[..., -1] = NEGATIVE_A, -NEGATIVE_A
    elif scores == "huge":
        q, k = q * np.float32(HUGE_GAIN), k * np.float32(HUGE_GAIN)
    else:
        raise ValueError(f"scores: expected 'negative' or 'huge', got {scores!r}")
    return q, k


def qkv(case: Case) -> dict:
    """q, k, v, dO (fixed per case); q and k shaped by the case's `scores` option."""
    s = case.sizes
    shape_q, shape_k = (s["B"], s["H"], s["Nq"], s["d"]), (s["B"], s["H"], s["Nk"], s["d"])
    q, k, v, dO = fixed_normal(case.seed, shape_q, shape_k, shape_k, shape_q)
    q, k = shaped_scores(case, q, k)
    return {"q": q, "k": k, "v": v, "dO": dO}


def options(case: Case) -> dict:
    """The wrappers' keyword options of `case` (the attention's, not the instantiation's)."""
    o = case.options
    return dict(causal=o["causal"], scale=o.get("scale"), dropout_p=o["dropout_p"],
                seed=o.get("seed", SEED), offset=o.get("offset", OFFSET))


def on_device(inputs) -> dict:
    xp = device.xp()
    return {k: xp.asarray(v) for k, v in inputs.items()}


# ---- the instantiations: what the wrappers can launch from the learner's file ---------------
# the template arguments after <Dt, Br, Bc> of each kernel, as table.instantiations names them
_SWITCHES = {"attn_flash_fwd": ("stored",), "attn_flash_bwd_dkdv": ("deterministic", "stored")}
VARIANT_TEXT = {
    "stored": ("stored", "the stored method's instantiation (STORED = true: the forward also "
               "writes S, the backward reads it back)"),
    "deterministic": ("deterministic", "the deterministic dQ (DETERMINISTIC = true: no "
                      "atomics, dQ by the second kernel)"),
    "deterministic,stored": ("stored_deterministic", "the stored method with the deterministic "
                             "dQ (STORED and DETERMINISTIC true: K is not loaded)"),
}


def switches(filename: str, d: int = 32) -> list[dict]:
    """The template switches ({'stored': bool, ...}) of every instantiation of `filename` the
    wrappers launch at head dim d with the check's tiles, read from the wrappers' own list."""
    out = []
    for name in instantiations(filename, (tile_head_dim(d),), tiles=TILES):
        base, args = re.fullmatch(r"(\w+)<(.*)>", name).groups()
        if base in _SWITCHES:
            flags = [a.strip() == "true" for a in args.split(",")[3:]]
            out.append(dict(zip(_SWITCHES[base], flags, strict=True)))
    return out


def variants(filename: str, cases=()) -> tuple:
    """A Variant for every instantiation of `filename` but the default (all switches off),
    run on the cases labelled `cases` (all when empty)."""
    out = []
    for sw in switches(filename):
        on = ",".join(sorted(k for k, v in sw.items() if v))
        if on:
            label, phrase = VARIANT_TEXT[on]
            out.append(Variant(label, phrase, dict(sw), tuple(cases)))
    return tuple(out)


def cases_of(filename: str, default: tuple, only=()) -> tuple:
    """The default instantiation's cases, then every other instantiation's (on `only`)."""
    return with_variants(default, variants(filename, only))
