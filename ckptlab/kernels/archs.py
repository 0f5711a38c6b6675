"""Which GPUs run which kernels: the instantiations each compute capability (arch) supports,
and the reason for each it refuses, decided before anything is compiled.

    ARCHS            the arches the project compiles for and the GPUs learners have on them
    WMMA_MIN_ARCH    the first arch whose tensor cores (nvcuda::wmma) take each input type
    SHARED_MAX       the most shared memory one block may opt in to, per arch
    refusal(kernel, arch)       why `arch` cannot run an instantiation, or None
    dtype_refusal(dtype, arch)  why it runs nothing in a dtype (support_table's reason)
    supported(file, arch)       the instantiations of a kernel file `arch` runs
    support_table()             methods x dtypes x arches: what runs where, and why not
    tc_dtype(arch)              the 16-bit type the labs use there: bfloat16, else float16

A T4 (sm_75) runs the fp32 kernels and the float16 tensor-core ones; bf16 and tf32 wmma need
sm_80 (Ampere), so there they are refused with the reason instead of failing to compile
(`incomplete type nvcuda::wmma::fragment<..., __nv_bfloat16, ...>`).
"""

from __future__ import annotations

import re

from ckptlab.emu import abi
from ckptlab.kernels import table

# arch -> GPUs a learner meets on it (NVIDIA, "CUDA GPUs - Compute Capability",
# https://developer.nvidia.com/cuda-gpus)
ARCHS = {
    "sm_75": "T4, RTX 20xx",
    "sm_80": "A100",
    "sm_86": "A10G, RTX 30xx (3090)",
    "sm_89": "L4, RTX 40xx (4090)",
    "sm_90": "H100, H200",
}
# CUDA C++ Programming Guide, "Warp Matrix Functions" (7.24 in CUDA 12): __half fragments from
# compute capability 7.0; "Alternate Floating Point" (__nv_bfloat16, precision::tf32) "is
# supported on devices of compute capability 8.0 and above". wmma_gemm<float> runs tf32.
WMMA_MIN_ARCH = {"__half": 70, "__nv_bfloat16": 80, "float": 80}
WMMA_NAMES = {"__half": "float16", "__nv_bfloat16": "bfloat16", "float": "tf32 (float inputs)"}
# CUDA C++ Programming Guide, "Technical Specifications per Compute Capability": "Maximum
# amount of shared memory per thread block" 64 KB (7.5), 163 KB (8.0), 99 KB (8.6, 8.9),
# 227 KB (9.0: the emulator's opt-in limit, emu/abi.h); above 48 KB a launch opts in.
SHARED_MAX = {75: 64 * 1024, 80: 163 * 1024, 86: table.TC_SHARED_MAX, 89: table.TC_SHARED_MAX,
              90: abi.SHARED_OPTIN_LIMIT}
TC_KERNELS = ("attn_flash_fwd_tc", "attn_flash_bwd_dkdv_tc", "attn_flash_bwd_dq_tc",
              "attn_flash_bwd_preprocess_tc", "attn_flash_bwd_dq_convert_tc", "wmma_gemm")


def arch_number(arch) -> int:
    """'sm_75' (or 75, or '7.5') -> 75, for the arches of ARCHS."""
    text = str(arch)
    m = re.fullmatch(r"(?:sm_)?(\d)\.?(\d)", text)
    if not m or int(m[1] + m[2]) not in SHARED_MAX:
        raise ValueError(f"arch: expected one of {list(ARCHS)}, got {arch!r}")
    return int(m[1] + m[2])


def _wmma_type(kernel: str) -> str | None:
    """The input type of a tensor-core instantiation ('wmma_gemm<__half>' -> '__half')."""
    base, _, args = kernel.partition("<")
    if base.strip() not in TC_KERNELS or not args:
        return None
    return args.rstrip(">").split(",")[0].strip()


def refusal(kernel: str, arch) -> str | None:
    """Why `arch` cannot run the instantiation `kernel` (as ptxas names it), or None: its wmma
    input type needs a newer arch, or its shared memory is more than one block may have."""
    n = arch_number(arch)
    ctype = _wmma_type(kernel)
    if ctype in WMMA_MIN_ARCH and n < WMMA_MIN_ARCH[ctype]:
        need = WMMA_MIN_ARCH[ctype]
        return (f"{WMMA_NAMES[ctype]} tensor cores (wmma) need sm_{need} or newer; sm_{n} "
                f"({ARCHS[f'sm_{n}']}) has none" +
                (": use float16, or the fp32 kernels" if ctype != "__half" else ""))
    shared = table.dynamic_shared_bytes(kernel)
    if shared is not None and shared > SHARED_MAX[n]:
        return (f"needs {shared} bytes of shared memory per block; sm_{n} allows at most "
                f"{SHARED_MAX[n]}: use smaller tiles")
    return None


def supported(filename: str, arch) -> list[str]:
    """The default instantiations of kernels/`filename` (table.instantiations) `arch` runs."""
    return [k for k in table.instantiations(filename) if refusal(k, arch) is None]


def refused(filename: str, arch) -> dict[str, str]:
    """{instantiation: reason} for those of kernels/`filename` that `arch` cannot run."""
    return {k: r for k in table.instantiations(filename) if (r := refusal(k, arch))}


def check(kernel: str, arch) -> None:
    """Raise ValueError with the reason when `arch` cannot run `kernel` (before compiling)."""
    reason = refusal(kernel, arch)
    if reason is not None:
        raise ValueError(f"{kernel} cannot run on {arch}: {reason}")


# (method, dtype) -> the kernel files it launches
METHOD_FILES = {
    ("naive, stored, flash", "float32"): ("attn_naive_fwd.cu", "attn_naive_bwd.cu",
                                          "attn_flash_fwd.cu", "attn_flash_bwd.cu"),
    ("stored, flash (tensor cores)", "float16"): ("attn_flash_fwd_tc.cu", "attn_flash_bwd_tc.cu"),
    ("stored, flash (tensor cores)", "bfloat16"): ("attn_flash_fwd_tc.cu",
                                                   "attn_flash_bwd_tc.cu"),
    ("wmma_gemm", "float16"): ("wmma_gemm.cu",),
    ("wmma_gemm", "bfloat16"): ("wmma_gemm.cu",),
    ("wmma_gemm", "tf32"): ("wmma_gemm.cu",),
}
_CTYPE = {"float16": "__half", "bfloat16": "__nv_bfloat16", "tf32": "float", "float32": None}


def support_table(archs=tuple(ARCHS)) -> list[dict]:
    """One row per (method, dtype): {"method", "dtype", arch: "runs" | "runs, except ..." |
    "refused: reason"} for each arch, from refusal() on every default instantiation."""
    rows = []
    for (method, dtype), files in METHOD_FILES.items():
        ctype = _CTYPE[dtype]
        kernels = [k for f in files for k in table.instantiations(f) if k.startswith(TC_KERNELS)
                   and _wmma_type(k) == ctype] if ctype else \
            [k for f in files for k in table.instantiations(f)]
        row = {"method": method, "dtype": dtype}
        for arch in archs:
            reasons = {k: refusal(k, arch) for k in kernels}
            bad = [k for k, r in reasons.items() if r]
            if not bad:
                row[arch] = "runs"
            elif len(bad) == len(kernels):
                row[arch] = f"refused: {reasons[bad[0]]}"
            else:
                dims = sorted({int(k.split(",")[1]) for k in bad})
                row[arch] = f"runs, except tile head dim {', '.join(map(str, dims))}: " + \
                    reasons[bad[0]]
        rows.append(row)
    return rows


def format_support_table(rows: list[dict], archs=tuple(ARCHS)) -> str:
    """A Markdown table of support_table(): short cells, the reasons listed below it."""
    notes: list[str] = []

    def cell(text: str) -> str:
        if text == "runs":
            return "yes"
        if text not in notes:
            notes.append(text)
        return ("partly" if text.startswith("runs, except") else "no") + \
            f" ({notes.index(text) + 1})"

    head = ["method", "dtype"] + [f"{a} ({ARCHS[a].split(' (')[0].split(',')[0]})"
                                  for a in archs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([r["method"], r["dtype"]] +
                                       [cell(r[a]) for a in archs]) + " |")
    lines += [""] + [f"- ({k + 1}) {n.removeprefix('refused: ')}" for k, n in enumerate(notes)]
    return "\n".join(lines)


DTYPE_NAMES = {"fp32": "float32", "float32": "float32", "fp16": "float16", "float16": "float16",
               "half": "float16", "bf16": "bfloat16", "bfloat16": "bfloat16", "tf32": "tf32"}


def dtype_refusal(dtype: str, arch) -> str | None:
    """Why `arch` runs no kernel in `dtype` ('bf16', 'fp16', 'tf32', 'float32'... DTYPE_NAMES),
    or None: support_table's reason where it refuses every row of that dtype on `arch`."""
    name = DTYPE_NAMES.get(str(dtype).lower())
    if name is None:
        raise ValueError(f"dtype: expected one of {sorted(DTYPE_NAMES)}, got {dtype!r}")
    key = f"sm_{arch_number(arch)}"
    cells = [r[key] for r in support_table((key,)) if r["dtype"] == name]
    if all(c.startswith("refused: ") for c in cells):
        return cells[0].removeprefix("refused: ")
    return None


def tc_dtype(arch) -> str:
    """The 16-bit dtype for the tensor-core kernels on `arch`: bfloat16 where its wmma runs
    (sm_80 and newer, 'sm_100' too; None, the emulator, runs every type), else float16 (a T4).
    The labs call it with current_arch()."""
    if arch is None:
        return "bfloat16"
    newer = re.fullmatch(r"sm_(\d{3})[af]?", str(arch))  # sm_100, sm_120: past ARCHS
    n = int(newer[1]) if newer else arch_number(arch)
    return "bfloat16" if n >= WMMA_MIN_ARCH["__nv_bfloat16"] else "float16"


def current_arch() -> str | None:
    """'sm_XY' of the GPU the cuda target runs on, or None on the emulator."""
    from ckptlab import device

    if device.target() != "cuda":
        return None
    import cupy

    return f"sm_{cupy.cuda.Device().compute_capability}"


class ArchUnsupported(ValueError):
    """An instantiation the arch cannot run (bf16 wmma on sm_75...): refused before compiling,
    with refusal's reason."""


def to_compile(filename: str, arch: str, asked=None) -> list:
    """The template kernels of kernels/`filename` to compile for `arch`: those asked for
    (ArchUnsupported for one `arch` cannot run), or by default the ones ckptlab.kernels launches
    from the file that `arch` runs."""
    if not isinstance(arch, str) or not re.fullmatch(r"sm_\d{2,3}[af]?", arch):
        raise ValueError(f"arch: expected a real GPU arch such as 'sm_80' or 'sm_90', got {arch!r}")
    known = arch in ARCHS
    if asked is None:  # the default ones this arch runs (all of them on sm_80+)
        return supported(filename, arch) if known else table.instantiations(filename)
    for name in asked if known else ():
        if reason := refusal(name, arch):
            raise ArchUnsupported(f"{name} cannot run on {arch}: {reason}")
    return list(asked)
