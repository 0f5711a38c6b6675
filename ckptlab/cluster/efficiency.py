"""The fraction of a GPU's peak a training step's arithmetic reaches, by the size of its matmuls.
Every number here is *modeled*.

    fraction(GPTShape(96, 12288, 96, 2048, 51200), Layout(tp=8, micro_batch=1), "A100")

A layer's GEMMs on one GPU (Megatron's split over t) are (b s) x h -> 3h/t (QKV), (b s) x h/t
-> h (the projection), (b s) x h -> 4h/t and (b s) x 4h/t -> h (the MLP). The fraction of the
peak is taken as a function of x = h, the reduction (K) dimension of QKV and the first MLP
GEMM (14 of the layer's 24 b s h^2 / t FLOPs), which neither tensor parallelism nor the
micro-batch splits; it rises with x and saturates:

    fraction = E_MAX * x / (x + X_HALF)

A GEMM runs as output tiles (cuBLAS's 128 x 256, 256 x 128 ...), each looping over K in steps
of the tile's depth with a fixed prologue and epilogue, spread in waves over the SMs: the longer
the K loop the smaller the share of the fixed part, and the more work a wave holds (NVIDIA,
"Matrix Multiplication Background User's Guide", sections 2.3 "Typical Tile Dimensions in cuBLAS
and Performance" and 3 "Dimension Quantization Effects": performance grows with the dimensions
and levels off). Narayanan et al. 2021 (section 5.1) see the same in whole runs: the achieved
teraFLOP/s rise with the model's size as its GEMMs grow. The saturating curve is the simplest
form with both ends; its two constants are fitted, not derived. The smallest dimension,
min(h / t, b s), was the first choice of x: fitted on the same calibration rows it gave
X_HALF = 0 (no size effect) with twice the squared error of x = h, so x = h is used (the choice
made on the calibration rows alone). The micro-batch does not enter: the calibration rows do not
publish theirs. The constants are the A100's; other GPUs use them as they are.

E_MAX and X_HALF are fitted by `python -m ckptlab bench plan-check --fit` on the calibration
rows named in ckptlab.cluster.published_runs (CALIBRATION, with why those) and frozen here;
tests/test_plan_check.py checks the fit gives them and reads no other row.
"""

from __future__ import annotations

E_MAX = 0.669
X_HALF = 400.0


def gemm_width(model, layout) -> int:
    """x: the reduction dimension of the layer's QKV and first MLP GEMMs, h."""
    return model.hidden


def curve(x: float, e_max: float = E_MAX, x_half: float = X_HALF) -> float:
    """e_max x / (x + x_half), in (0, e_max]."""
    if not x > 0:
        raise ValueError(f"x: expected a positive GEMM dimension, got {x!r}")
    return e_max * x / (x + x_half)


def fraction(model, layout, gpu=None, constants: tuple | None = None) -> float:
    """The fraction of `gpu`'s peak the step's matmuls and attention run at: curve(x) with
    x = gemm_width(model, layout) = h; constants = (e_max, x_half) to try others (the fit)."""
    e_max, x_half = constants if constants is not None else (E_MAX, X_HALF)
    return curve(gemm_width(model, layout), e_max, x_half)
