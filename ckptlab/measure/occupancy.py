"""How many blocks of a kernel run at once on a GPU: its launch shape, its resources (registers,
shared memory, threads) and the resident blocks per SM they allow.

    geometry(kernel, B, H, Nq, Nk, d)   (blocks, threads per block) of one launch, as the wrappers
                                        in ckptlab.kernels launch it (tests/test_timemodel.py
                                        checks every kernel against the emulator's record)
    resources(kernel, arch)             registers and static shared memory per thread/block, from
                                        NVIDIA's compiler (ptxas -v through NVRTC or nvcc,
                                        ckptlab.kernels.nvrtc; about a second per template
                                        instantiation), cached on disk by source hash; with
                                        no compiler, shared memory from the tile table and
                                        registers unknown, and the record says so. The
                                        tensor-core kernels' dynamic shared memory (which
                                        ptxas cannot see: the launch sets it) comes from the
                                        tile table either way
    resident_blocks(threads, resources, spec)
                                        blocks per SM: the least of what the threads, the
                                        registers and the shared memory allow (the CUDA occupancy
                                        calculator's rules)

The limits per compute capability come from the CUDA C++ Programming Guide's table (threads,
blocks and registers per SM; OCCUPANCY_SOURCE); shared memory per SM and the SM count from
roofline.SPECS, which cites its sources.
"""

from __future__ import annotations

import functools
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ckptlab.device import KERNELS_DIR
from ckptlab.kernels import nvrtc
from ckptlab.kernels.common import ceil_div
from ckptlab.kernels.table import (
    LANES,
    NAIVE_TILE,
    SOFTMAX_ROWS,
    TC_CONVERT_THREADS,
    WARP,
    dkdv_shared_bytes,
    dq_shared_bytes,
    dynamic_shared_bytes,
    flash_fwd_shared_bytes,
    tc_block_threads,
)

OCCUPANCY_SOURCE = (
    "CUDA C++ Programming Guide, 'Technical Specifications per Compute Capability' "
    "(https://docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/"
    "compute-capabilities.html): "
    "resident threads per SM 1024 (7.5), 2048 (8.0, 9.0) and 1536 (8.6, 8.9), resident blocks "
    "per SM 16 (7.5, 8.6), 32 (8.0, 9.0) and 24 (8.9), 64 K 32-bit registers per SM; 1 KB of "
    "shared memory reserved per block (8.x, 9.0; 7.5 reserves none, taken as 1 KB here); "
    "registers allocated per warp in units of 256, warps in groups of 4 (CUDA occupancy "
    "calculator, cross-checked in https://docs.rs/optirs-gpu/latest/optirs_gpu/occupancy/"
    "struct.SmResourceLimits.html)"
)
ARCH_LIMITS = {  # per compute capability: what one SM can hold at once
    "sm_75": dict(threads=1024, blocks=16, registers=65536),
    "sm_80": dict(threads=2048, blocks=32, registers=65536),
    "sm_86": dict(threads=1536, blocks=16, registers=65536),
    "sm_89": dict(threads=1536, blocks=24, registers=65536),
    "sm_90": dict(threads=2048, blocks=32, registers=65536),
}
REG_UNIT = 256  # registers are allocated per warp in multiples of 256
WARP_UNIT = 4  # and warps in groups of 4 (one per SM sub-partition)
SMEM_RESERVED = 1024  # bytes of shared memory the system keeps per resident block
NO_COMPILER = ("no CUDA compiler here: shared memory from the tile table, registers unknown, so "
               "resident blocks come from shared memory and threads only (an upper bound)")


@dataclass(frozen=True)
class Resources:
    """What one block of a kernel holds: registers per thread (None when unknown), static
    shared memory (what ptxas reports) and dynamic shared memory (what the launch asks for: the
    tensor-core kernels'); `source` says where the registers and static bytes came from."""

    registers: int | None
    smem: int
    source: str
    dynamic_smem: int = 0

    @property
    def shared(self) -> int:
        """All the shared memory a resident block holds: static + dynamic."""
        return self.smem + self.dynamic_smem


# ---------------------------------------------------------------- launch shapes


def base_name(kernel: str) -> str:
    """'attn_flash_fwd<64, 64, 32>' -> 'attn_flash_fwd'."""
    return kernel.split("<")[0]


def template_args(kernel: str) -> list[str]:
    """'attn_flash_bwd_dkdv<64, 32, 32, false>' -> ['64', '32', '32', 'false']."""
    m = re.search(r"<(.*)>$", kernel)
    return [a.strip() for a in m[1].split(",")] if m else []


def is_tensor_core(kernel: str) -> bool:
    """A kernel of kernels/attn_flash_*_tc.cu (table.tc_names): 'attn_flash_fwd_tc<__half, ...>'."""
    return base_name(kernel).endswith("_tc")


def _tc_geometry(kernel: str, BH: int, Nq: int, Nk: int, d: int) -> tuple[int, int]:
    """The tensor-core kernels as ckptlab.kernels.flash_tc launches them; the tiled ones are
    <T, Dt, Br, Bc, ...> with one warp per 16-row strip of the block's tile rows
    (table.tc_block_threads)."""
    name, args = base_name(kernel), template_args(kernel)
    if name == "attn_flash_bwd_preprocess_tc":  # one warp per row of all B*H*Nq rows
        return ceil_div(BH * Nq, SOFTMAX_ROWS), WARP * SOFTMAX_ROWS
    if name == "attn_flash_bwd_dq_convert_tc":  # one thread per dQ element
        return ceil_div(BH * Nq * d, TC_CONVERT_THREADS), TC_CONVERT_THREADS
    if len(args) >= 4 and all(a.isdigit() for a in args[1:4]):
        Br, Bc = int(args[2]), int(args[3])
        if name == "attn_flash_bwd_dkdv_tc":  # one block per K/V tile
            return ceil_div(Nk, Bc) * BH, tc_block_threads(Bc)
        if name in ("attn_flash_fwd_tc", "attn_flash_bwd_dq_tc"):  # one block per Q tile
            return ceil_div(Nq, Br) * BH, tc_block_threads(Br)
    raise ValueError(f"kernel: no launch shape known for {kernel!r}; expected a tensor-core "
                     "kernel that ckptlab.kernels.flash_tc launches (table.tc_names)")


def geometry(kernel: str, B: int, H: int, Nq: int, Nk: int, d: int) -> tuple[int, int]:
    """(blocks, threads per block) of one launch of `kernel`, as the wrappers launch it."""
    T, BH, name = NAIVE_TILE, B * H, base_name(kernel)
    if is_tensor_core(kernel):
        return _tc_geometry(kernel, BH, Nq, Nk, d)
    rows_kernels = {"attn_naive_softmax": Nq, "attn_naive_bwd_ds": Nq}
    if name in rows_kernels:  # one warp per row, SOFTMAX_ROWS rows per block
        return ceil_div(Nq, SOFTMAX_ROWS) * BH, WARP * SOFTMAX_ROWS
    if name.endswith("_bwd_preprocess"):  # one warp per row of all B*H*Nq rows
        return ceil_div(BH * Nq, SOFTMAX_ROWS), WARP * SOFTMAX_ROWS
    naive = {  # output tiles of C (rows x cols) = T x T threads each
        "attn_naive_scores": (Nq, Nk), "attn_naive_pv": (Nq, d),
        "attn_naive_bwd_dv": (Nk, d), "attn_naive_bwd_dp": (Nq, Nk),
        "attn_naive_bwd_dq": (Nq, d), "attn_naive_bwd_dk": (Nk, d),
    }
    if name in naive:
        rows, cols = naive[name]
        return ceil_div(rows, T) * ceil_div(cols, T) * BH, T * T
    args = [int(a) for a in template_args(kernel)[:3] if a.isdigit()]
    if len(args) == 3:  # <d, Br, Bc, ...>: a row group of LANES threads per tile row
        _, Br, Bc = args
        if name.endswith("_dkdv"):  # one block per K/V tile
            return ceil_div(Nk, Bc) * BH, LANES * Bc
        if name.endswith("_fwd") or name.endswith("_dq"):  # one block per Q tile
            return ceil_div(Nq, Br) * BH, LANES * Br
    raise ValueError(f"kernel: no launch shape known for {kernel!r}; expected a kernel that "
                     "ckptlab.kernels launches (attn_naive_*, attn_flash_*, attn_stored_*)")


# ---------------------------------------------------------------- resources


def table_shared_bytes(kernel: str) -> int:
    """Static shared memory of a kernel from the tile table (no compiler needed): the fused
    kernels' formulas of ckptlab.kernels.table, two padded NAIVE_TILE x (NAIVE_TILE + 1) float
    tiles for a naive matmul, none for the row-wise kernels nor for the tensor-core kernels
    (all of theirs is dynamic: table_dynamic_shared_bytes)."""
    name, args = base_name(kernel), template_args(kernel)
    if is_tensor_core(kernel):
        _tc_geometry(kernel, 1, 1, 1, 1)  # refuses a name flash_tc does not launch
        return 0
    if len(args) >= 4:  # <Dt, Br, Bc, ..., stored>
        (Dt, Br, Bc), flags = (int(a) for a in args[:3]), [a == "true" for a in args[3:]]
        if name.endswith("_fwd"):
            return flash_fwd_shared_bytes(Dt, Br, Bc)
        if name.endswith("_dkdv"):
            return dkdv_shared_bytes(Dt, Br, Bc, *flags)
        if name.endswith("_dq"):
            return dq_shared_bytes(Dt, Br, Bc, *flags)
    if name.endswith(("_softmax", "_ds", "_preprocess")):
        return 0
    if name.startswith("attn_naive_"):
        return 2 * 4 * NAIVE_TILE * (NAIVE_TILE + 1)
    raise ValueError(f"kernel: no shared memory formula for {kernel!r}")


def table_dynamic_shared_bytes(kernel: str) -> int:
    """Dynamic shared memory flash_tc launches `kernel` with (table.dynamic_shared_bytes: the
    kernels' FwdSmem / BwdSmem / DqSmem layouts); 0 for a kernel with static shared memory only.
    ptxas does not report it: the launch, not the compiler, sets it."""
    return dynamic_shared_bytes(kernel) or 0


@functools.lru_cache(maxsize=None)
def _file_of(name: str) -> str:
    """The kernels/*.cu file that defines the __global__ function `name`."""
    pattern = re.compile(rf"__global__\s+(?:void\s+)?(?:__launch_bounds__\s*\([^)]*\)\s*)?"
                         rf"(?:void\s+)?{re.escape(name)}\s*\(")
    for path in sorted(KERNELS_DIR.glob("*.cu")):
        if pattern.search(path.read_text()):
            return path.name
    raise ValueError(f"kernel: no file in {KERNELS_DIR} defines {name!r}")


@functools.lru_cache(maxsize=None)
def _compiled(filename: str, arch: str, names: tuple) -> dict:
    """kernel -> ptxas record for a file compiled for `arch` (with the template instantiations
    `names`); nvrtc.compile_file keeps the records on disk (kernels.ptxas_cache), keyed by the
    file, every header beside it, the compiler and its options."""
    records = nvrtc.compile_file(KERNELS_DIR / filename, arch, instantiations=list(names))
    return {r["kernel"]: {k: r[k] for k in ("registers", "smem", "backend")}
            for r in records if r["kind"] == "kernel"}


def prefetch(kernels, arch: str, workers: int | None = None) -> None:
    """Compile, two or more at a time, the ptxas reports that resources(kernel, arch) will ask
    for, one per kernel of `kernels` not on disk yet. NVRTC releases the GIL while it compiles,
    so threads use every core (a cold lab 08 compiles some forty instantiations, about a second
    each). Failures are left for resources() to raise, one at a time, as it does without this."""
    if arch not in ARCH_LIMITS:
        raise ValueError(f"arch: expected one of {sorted(ARCH_LIMITS)}, got {arch!r}")
    jobs = {(_file_of(base_name(k)), (k,) if "<" in k else ()) for k in kernels}
    todo = sorted(job for job in jobs if not _on_disk(*job, arch))
    if len(todo) < 2:
        return

    def compile_one(job):
        try:
            _compiled(job[0], arch, job[1])
        except Exception:  # noqa: BLE001 - resources() raises it where it is asked for
            pass

    with ThreadPoolExecutor(workers or min(len(todo), os.cpu_count() or 1)) as pool:
        list(pool.map(compile_one, todo))


def _on_disk(filename: str, names: tuple, arch: str) -> bool:
    """Whether compile_file already keeps these records (no compiler, or a refused
    instantiation: say yes, there is nothing to compile ahead)."""
    try:
        kept, _, _ = nvrtc.kept_path(KERNELS_DIR / filename, arch, instantiations=list(names))
    except Exception:  # noqa: BLE001 - no compiler, a refusal: resources() says so itself
        return True
    return kept.is_file()


@functools.lru_cache(maxsize=None)
def resources(kernel: str, arch: str) -> Resources:
    """Registers per thread and static shared memory of `kernel` compiled for `arch`: ptxas'
    report, compiled when first asked for (a template kernel alone, as an NVRTC name
    expression; a file's extern "C" kernels together) and kept on disk; without a CUDA
    compiler the table's shared memory and no registers (NO_COMPILER). Dynamic shared memory
    (the tensor-core kernels') comes from the tile table in both cases."""
    if arch not in ARCH_LIMITS:
        raise ValueError(f"arch: expected one of {sorted(ARCH_LIMITS)}, got {arch!r}")
    filename = _file_of(base_name(kernel))
    names = (kernel,) if "<" in kernel else ()
    try:
        report = _compiled(filename, arch, names)
    except nvrtc.CompilerNotFound:
        return Resources(None, table_shared_bytes(kernel), NO_COMPILER,
                         table_dynamic_shared_bytes(kernel))
    if kernel not in report:
        raise ValueError(f"kernel: the compiler's report of {filename} has no {kernel!r}; "
                         f"it has {sorted(report)}")
    r = report[kernel]
    return Resources(r["registers"], r["smem"], f"ptxas ({r['backend']}, {arch})",
                     table_dynamic_shared_bytes(kernel))


# ---------------------------------------------------------------- occupancy


def resident_blocks(threads: int, res: Resources, spec: dict) -> tuple[int, str]:
    """(blocks of this kernel one SM holds at once, the resource that limits it) on the GPU of
    `spec` (a roofline.spec dict): the least of the limits on blocks, threads (whole warps),
    registers (REG_UNIT per warp, WARP_UNIT warps at a time; skipped when unknown) and shared
    memory (static + dynamic + SMEM_RESERVED per block)."""
    lim = ARCH_LIMITS[spec["arch"]]
    if not 1 <= threads <= 1024:
        raise ValueError(f"threads: expected 1..1024 per block, got {threads}")
    warps = ceil_div(threads, WARP)
    limits = {"blocks": lim["blocks"], "threads": lim["threads"] // (warps * WARP)}
    if res.registers is not None:
        per_warp = ceil_div(res.registers * WARP, REG_UNIT) * REG_UNIT
        warps_by_regs = lim["registers"] // per_warp // WARP_UNIT * WARP_UNIT
        limits["registers"] = warps_by_regs // warps
    limits["shared memory"] = spec["smem_per_sm_bytes"] // (res.shared + SMEM_RESERVED)
    limiter = min(limits, key=limits.get)
    if limits[limiter] < 1:
        raise ValueError(f"a block of {threads} threads with {res} does not fit on one SM of "
                         f"{spec.get('name', 'this GPU')} ({limiter})")
    return limits[limiter], limiter
