"""The labs' size knob: one setting picks the sizes of every lab.

    small   the default on a CPU: every notebook runs in well under a minute on 2 cores
    large   on a CPU with time to spare: bigger N, deeper chains, more repeats (minutes)
    gpu     the default on an NVIDIA GPU (target "cuda"): sizes worth timing on the chip

Set it with the environment variable CKPTLAB_LAB_SCALE=small|large|gpu before starting Jupyter,
or in a notebook's first cell: `LAB_SCALE = "large"` then `sizes.scale(LAB_SCALE)`. A notebook
asks `sizes.pick(small=..., large=..., gpu=...)` for each size it uses.
"""

from __future__ import annotations

import os

from ckptlab import device

SCALES = ("small", "large", "gpu")
ENV = "CKPTLAB_LAB_SCALE"

_chosen: str | None = None


def scale(override: str | None = None) -> str:
    """The scale in force: `override` if given (it then stays for this process), else the one
    set last, else CKPTLAB_LAB_SCALE, else "gpu" on the cuda target and "small" elsewhere.
    "gpu" without a GPU is refused: the sizes would not fit a CPU's time."""
    global _chosen
    value = override if override is not None else _chosen or os.environ.get(ENV) or None
    if value is None:
        value = "gpu" if device.target() == "cuda" else "small"
    value = str(value).strip().lower()
    if value not in SCALES:
        raise ValueError(f"lab scale: expected one of {SCALES} (from {ENV} or the first "
                         f"cell), got {value!r}")
    if value == "gpu" and device.target() != "cuda":
        raise ValueError(f"lab scale 'gpu' needs the cuda target (an NVIDIA GPU with CuPy); "
                         f"this run is on {device.target()!r}: use 'small' or 'large'")
    if override is not None:
        _chosen = value
    return value


def pick(*, small, large=None, gpu=None):
    """The value for the scale in force; `large` defaults to `small`, `gpu` to `large`."""
    s = scale()
    if s == "small":
        return small
    if s == "large":
        return small if large is None else large
    return gpu if gpu is not None else (small if large is None else large)


def reset() -> None:
    """Forget a scale set by scale(override) (tests)."""
    global _chosen
    _chosen = None
