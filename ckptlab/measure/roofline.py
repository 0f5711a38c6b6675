"""The roofline: how fast a kernel could run on a named GPU, given its FLOPs and HBM bytes.

A kernel that does F FLOPs and moves B bytes of HBM traffic needs at least
    t = max(F / peak_FLOP_per_s, B / HBM_bytes_per_s)
seconds. Whichever term wins says what bounds it: arithmetic ("compute") or memory traffic
("memory"). Its arithmetic intensity I = F / B (FLOP per byte) against the device's ridge
point peak / bandwidth tells the same thing without a size: below the ridge it is memory-bound.
Every time from here is *modeled*, never measured: callers must label it so (docs/design.md,
"Measurement").

The spec table (ckptlab.measure.gpus) holds vendor peak numbers, each with the document it was
read from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ckptlab.device import xp
from ckptlab.measure.gpus import ALIASES, KIB, MIB, SPECS  # noqa: F401 (re-exported)

# dtype name -> which peak applies: plain FP32 on CUDA cores, or 16-bit on tensor cores.
DTYPE_PEAK = {
    "fp32": "fp32_flops",
    "float32": "fp32_flops",
    "fp16": "tensor16_flops",
    "float16": "tensor16_flops",
    "half": "tensor16_flops",
    "bf16": "tensor16_flops",
    "bfloat16": "tensor16_flops",
}


def spec(name) -> dict:
    """The spec dict of a device, by its table name or a short alias ("a100", "h100", "4090");
    a dict is passed through (after checking it has the fields the functions here read)."""
    if isinstance(name, dict):
        missing = [k for k in ("fp32_flops", "tensor16_flops", "hbm_bytes_per_s") if k not in name]
        if missing:
            raise ValueError(f"spec: the dict lacks {missing}; expected the fields of SPECS")
        return name
    if not isinstance(name, str):
        got = type(name).__name__
        raise TypeError(f"spec: expected a device name (str) or a spec dict, got {got}")
    key = ALIASES.get(name.strip().lower().replace(" ", ""), name.strip())
    for table_name, entry in SPECS.items():
        if table_name.lower() == key.lower():
            return {"name": table_name, **entry}
    known = sorted(SPECS) + sorted(ALIASES)
    raise ValueError(f"spec: unknown device {name!r}; expected one of {known}")


def _dtype_name(dtype) -> str:
    name = dtype
    if not isinstance(dtype, str):  # a numpy dtype or scalar type: np.float16 -> "float16"
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = None
    if not isinstance(name, str) or name.lower() not in DTYPE_PEAK:
        raise ValueError(f"dtype: expected one of {sorted(DTYPE_PEAK)}, got {dtype!r}")
    return name.lower()


def peak_flops(device, dtype: str = "fp32") -> float:
    """Peak FLOP/s of `device` for `dtype`: FP32 on CUDA cores, FP16/BF16 on tensor cores."""
    return float(spec(device)[DTYPE_PEAK[_dtype_name(dtype)]])


def check_count(name: str, value, *, positive: bool = False) -> float:
    if isinstance(value, (bool, str)) or not hasattr(value, "__float__"):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    value = float(value)
    if not value >= 0 or value == float("inf") or (positive and value == 0):
        need = "a positive finite number" if positive else "a non-negative finite number"
        raise ValueError(f"{name}: expected {need}, got {value}")
    return value


def arithmetic_intensity(flops, bytes_moved) -> float:
    """I = FLOPs / bytes of HBM traffic (FLOP per byte)."""
    flops = check_count("flops", flops)
    bytes_moved = check_count("bytes_moved", bytes_moved, positive=True)
    return flops / bytes_moved


def ridge_point(device, dtype: str = "fp32") -> float:
    """The intensity where the roofs meet: peak FLOP/s / bandwidth (FLOP per byte). Kernels
    below it are memory-bound on this device."""
    return peak_flops(device, dtype) / spec(device)["hbm_bytes_per_s"]


def attainable_flops(intensity, device, dtype: str = "fp32") -> float:
    """The roof at intensity I: min(peak FLOP/s, I * bandwidth)."""
    intensity = check_count("intensity", intensity)
    return min(peak_flops(device, dtype), intensity * spec(device)["hbm_bytes_per_s"])


@dataclass(frozen=True)
class ModeledTime:
    """t = max(compute_s, memory_s) on `device`; `bound` says which term won ("memory" on a tie,
    the exact ridge). Always a modeled number (source="modeled"), never a measurement."""

    seconds: float
    bound: str
    compute_s: float
    memory_s: float
    device: str
    dtype: str
    source: str = "modeled"


def modeled_time(flops, bytes_moved, device, dtype: str = "fp32") -> ModeledTime:
    """Roofline time: max(FLOPs / peak FLOP/s, bytes / bandwidth), and which bound won."""
    flops = check_count("flops", flops)
    bytes_moved = check_count("bytes_moved", bytes_moved)
    s = spec(device)
    compute_s = flops / peak_flops(s, dtype)
    memory_s = bytes_moved / s["hbm_bytes_per_s"]
    bound = "compute" if compute_s > memory_s else "memory"
    seconds = max(compute_s, memory_s)
    name = s.get("name", "custom")
    return ModeledTime(seconds, bound, compute_s, memory_s, name, _dtype_name(dtype))


def utilization(flops, seconds, device, dtype: str = "fp32") -> float:
    """Achieved FLOP/s as a fraction of peak: flops / seconds / peak. With model FLOPs (useful
    work) this is MFU; with hardware FLOPs (recompute included) it is HFU."""
    flops = check_count("flops", flops)
    seconds = check_count("seconds", seconds, positive=True)
    return flops / seconds / peak_flops(device, dtype)


def current_gpu() -> str | None:
    """The SPECS name of the GPU the "cuda" target sees, matched by its name (None if it is not
    in the table)."""
    cp = xp("cuda")
    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    for key in ("H200", "H100", "A100", "L4", "4090", "3090", "T4", "A10"):
        if key in name.replace(" ", ""):
            return spec("a100-40gb" if key == "A100" and "40GB" in name else key.lower())["name"]
    return None
