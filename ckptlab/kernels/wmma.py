"""kernels/wmma_gemm.cu, C = A B on tensor cores (one warp per 16 x 16 tile of C), loaded for one
input type only: the type asked for, and only where the GPU's tensor cores take it. A T4
(sm_75) refuses bfloat16 and tf32 with the reason (ckptlab.kernels.archs) before anything is
compiled; float16 runs there. The emulator runs every type.

    f = wmma.gemm(np.float16)       # or ml_dtypes.bfloat16, or np.float32 (tf32 inputs)
    f(grid, (32,), (A, B, C, np.int32(M), np.int32(N), np.int32(K)))   # C fp32, (M, N)
"""

from __future__ import annotations

import numpy as np

from ckptlab import device
from ckptlab.kernels import archs
from ckptlab.kernels.nvrtc import cuda_include_options
from ckptlab.kernels.table import TC_TYPES, template_name

CTYPES = {**TC_TYPES, "float32": "float"}  # NumPy dtype name -> T of wmma_gemm<T>


def gemm(dtype):
    """The kernel function wmma_gemm<T> for inputs of `dtype`, that one instantiation compiled
    (or emulated); ValueError with the reason where the current GPU cannot run it."""
    name = np.dtype(dtype).name
    if name not in CTYPES:
        raise ValueError(f"dtype: expected one of {sorted(CTYPES)}, got {name}")
    kernel = template_name("wmma_gemm", CTYPES[name])
    arch = archs.current_arch()
    if arch in archs.ARCHS:
        archs.check(kernel, arch)  # before the compile: NVRTC's own error names no reason
    # on a GPU, NVRTC needs CUDA's mma.h and cuda_bf16.h; the emulator has its own
    options = cuda_include_options() if device.target() == "cuda" else ()
    module = device.load("wmma_gemm.cu", options=options, name_expressions=(kernel,))
    return module.get_function(kernel)
