"""What a kernel file's C source says about its kernels, read before anything is compiled:
their names (`extern "C" __global__ void NAME(`), each one's parameter names as written, and the
NumPy dtype of each C parameter type, which the loader checks every argument against."""

from __future__ import annotations

import re

import numpy as np

DTYPES = {
    "float": np.float32, "double": np.float64, "int": np.int32, "unsigned int": np.uint32,
    "long long": np.int64, "unsigned long long": np.uint64, "long": np.int64,
    "unsigned long": np.uint64, "short": np.int16, "unsigned short": np.uint16,
    "char": np.int8, "signed char": np.int8, "unsigned char": np.uint8, "bool": np.bool_,
    "float2": np.float32, "float4": np.float32, "int2": np.int32, "int4": np.int32,
    "uint2": np.uint32, "uint4": np.uint32, "double2": np.float64,
    "__half": np.float16,  # emu/include/cuda_fp16.h; __nv_bfloat16: dtype_for
}


def dtype_for(ctype: str):
    """NumPy's type for a kernel parameter's C type (emu/include/cuda_bf16.h for bfloat16), or
    None. ml_dtypes is imported only for a kernel that takes __nv_bfloat16: importing it takes
    about a second (ml_dtypes 0.7), which every process that loads a kernel would pay."""
    if ctype == "__nv_bfloat16":
        import ml_dtypes
        return ml_dtypes.bfloat16
    return DTYPES.get(ctype)


VECTOR_BYTES = {"float2": 8, "float4": 16, "int2": 8, "int4": 16, "uint2": 8, "uint4": 16,
                "double2": 16}


# ---- finding kernels and their parameter names in the source --------------------------------
_KERNEL = re.compile(
    r'extern\s+"C"\s+__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+'
    r"(?:__launch_bounds__\s*\([^)]*\)\s*)?([A-Za-z_]\w*)\s*\("
)


def strip_comments(code: str) -> str:
    """Remove // and /* */ comments, keeping newlines (so line numbers stay right)."""
    return re.sub(r"//[^\n]*|/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group()), code,
                  flags=re.S)


def kernel_names(code: str) -> list[str]:
    """Names of the `extern "C" __global__ void NAME(` kernels, in source order."""
    return _KERNEL.findall(strip_comments(code))


def parameter_names(code: str, base: str) -> list[str]:
    """Parameter names of kernel `base` as written in the source ([] if not found)."""
    code = strip_comments(code)
    m = re.search(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+"
                  rf"(?:__launch_bounds__\s*\([^)]*\)\s*)?{re.escape(base)}\s*\(", code)
    if not m:
        return []
    depth, i, start = 1, m.end(), m.end()
    while i < len(code) and depth:
        depth += {"(": 1, ")": -1}.get(code[i], 0)
        i += 1
    params, depth, cur = [], 0, ""
    for ch in code[start:i - 1]:
        depth += {"<": 1, "(": 1, ">": -1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            params.append(cur)
            cur = ""
        else:
            cur += ch
    params.append(cur)
    names = []
    for p in params:
        words = re.findall(r"[A-Za-z_]\w*", p.split("=")[0])
        if words:
            names.append(words[-1])
    return names
