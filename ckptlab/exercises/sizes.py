"""The labs' size knob: one setting picks the sizes of every lab.

    small   the default on a CPU: every notebook runs in well under a minute on 2 cores
    large   on a CPU with time to spare: bigger N, deeper chains, more repeats (minutes)
    gpu     the default on an NVIDIA GPU (target "cuda"): sizes worth timing on the chip

Set it with the environment variable CKPTLAB_LAB_SCALE=small|large|gpu before starting Jupyter,
or in a notebook's first cell: `LAB_SCALE = "large"` then `sizes.scale(LAB_SCALE)`. A notebook
asks `sizes.pick(small=..., large=..., gpu=...)` for each size it uses, and `sizes.fitting(ns,
bytes_of)` keeps, on a GPU, only the sizes whose arrays fit its free memory (a 15 GiB T4 is not
an 80 GB A100).
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


FREE_FRACTION = 0.75  # of the free memory a sweep may plan for: the pool's blocks, temporaries


def fitting(ns, bytes_of, free: int | None = None) -> list:
    """The sizes of `ns` whose bytes_of(n) fit FREE_FRACTION of the GPU's free memory
    (device.free_bytes, or `free`); all of them on the emulator. A ValueError, naming the
    smallest size's need, when none fits."""
    free = device.free_bytes() if free is None else free
    if free is None:
        return list(ns)
    keep = [n for n in ns if bytes_of(n) <= FREE_FRACTION * free]
    if not keep:
        n = min(ns)
        raise ValueError(f"no size fits this GPU: the smallest, {n}, needs {bytes_of(n):,} bytes "
                         f"and {free:,} are free ({FREE_FRACTION:.0%} of them may be planned)")
    return keep
