"""Zero-copy views between torch tensors and the arrays ckptlab's launch wrappers take.

A CPU tensor runs on the emulator: `t.numpy()` and `torch.from_numpy(a)` share its memory. A
CUDA tensor runs on the GPU: `cupy.from_dlpack(t)` and `torch.from_dlpack(a)` share memory
through DLPack, and the kernels launch on torch's current stream (wrapped as a CuPy
ExternalStream), so they are ordered with torch's own work: no copy, no synchronisation.
Outputs on the GPU come from CuPy's memory pool, not torch's caching allocator.
"""

from __future__ import annotations

import contextlib

import ml_dtypes
import numpy as np
import torch

from ckptlab import device

# torch dtypes NumPy can view without a copy; bfloat16 has no NumPy dtype of its own: its bits
# are viewed as int16, then as ml_dtypes.bfloat16 (what the tensor-core wrappers take)
_VIEWABLE = {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32,
             torch.int64, torch.bool}
_BF16 = np.dtype(ml_dtypes.bfloat16)


def check_dense(name: str, t) -> None:
    """t is a torch.Tensor the kernels can read: dense (strided layout, not nested), with data
    on a CPU or a CUDA device. Each other kind is named, with what to pass instead."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__module__}."
                        f"{type(t).__name__}")
    if t.is_nested:
        raise TypeError(f"{name} is a nested tensor (torch.nested): the kernels take dense "
                        f"tensors; pad it ({name}.to_padded_tensor(0.0)) or pack its sequences "
                        "for flash_attn_varlen_func")
    if t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense tensor (layout torch.strided), got layout "
                        f"{t.layout}: pass {name}.to_dense()")
    if t.device.type == "meta":
        raise ValueError(f"{name} is a meta tensor (device meta: shapes, no data): the kernels "
                         "need its values, in a CPU tensor (the emulator) or a CUDA tensor")


def check_tensor(name: str, t, like=None) -> None:
    """What only a torch tensor can get wrong; the launch wrappers check the rest (dtype,
    rank, shape, contiguity) with their own messages."""
    check_dense(name, t)
    if like is not None and t.device != like.device:
        raise ValueError(f"{name} must be on q's device {like.device}, got {t.device}")
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} must be a CPU tensor (the emulator) or a CUDA tensor, got "
                         f"device {t.device}")
    if t.dtype not in _VIEWABLE:
        raise TypeError(f"{name} must have dtype float32 (or float16 / bfloat16 for the "
                        f"tensor-core kernels), got {t.dtype}")
    if t.dtype == torch.bfloat16 and t.device.type == "cuda":
        raise TypeError(f"{name}: bfloat16 CUDA tensors are not supported yet (their DLPack "
                        "view into CuPy is untested: no GPU has run it); use float16 or a "
                        "CPU tensor (the emulator)")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be C-contiguous (the kernels ignore strides), got a "
                         f"strided view of shape {tuple(t.shape)}: pass {name}.contiguous()")


def _numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.detach().view(torch.int16).numpy().view(_BF16)
    return t.detach().numpy()


def _tensor(a: np.ndarray) -> torch.Tensor:
    if a.dtype == _BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


@contextlib.contextmanager
def on(t: torch.Tensor):
    """Launch for tensors like `t`: on the emulator for a CPU tensor; on t's GPU and torch's
    current stream for a CUDA tensor. Yields (to_array, to_tensor), both zero-copy."""
    if t.device.type == "cpu":
        with device.use("emu"):
            yield _numpy, _tensor
        return
    with device.use("cuda"):
        cp = device.xp("cuda")
        stream = torch.cuda.current_stream(t.device).cuda_stream
        with cp.cuda.Device(t.device.index), cp.cuda.ExternalStream(stream):
            yield (lambda x: cp.from_dlpack(x.detach())), torch.from_dlpack
