"""Checkers of labs/01_roofline.ipynb (the roofline), one function per exercise.

The expected values come from ckptlab itself (the traffic models, the roofline, the float64
reference), never typed in, so an exercise follows the kernels if they change.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ckptlab import device, emu
from ckptlab.exercises.verdict import (
    NOT_YET,
    Verdict,
    close,
    exact,
    number,
    right,
    unanswered,
    wrong,
)
from ckptlab.exercises.write import in_notebook as write_kernel  # noqa: F401 (the labs' kernel cells)
from ckptlab.measure import roofline, traffic


def sgemm_bytes(answer, M: int, N: int, K: int) -> Verdict:
    """Global bytes (read + written) of kernels/sgemm_tiled.cu computing C (M, N) = A (M, K)
    B (K, N), fp32, 16 x 16 tiles."""
    t = traffic.sgemm_tiled(M, N, K)
    once = traffic.BYTES * (M * K + K * N + M * N)
    return exact(answer, t.bytes, "the byte count", hints=[
        (once, "that counts A, B and C once each: a tile of A is loaded by every block that "
               "needs it; how many blocks is that?"),
        (t.bytes_read, "that is the reads alone: C is written too"),
        (t.bytes / traffic.BYTES, "that counts elements: an fp32 element is 4 bytes"),
    ], hint=f"one block computes one {traffic.SGEMM_TILE} x {traffic.SGEMM_TILE} tile of C: "
            "how many blocks load each element of A, and each of B? (the sizes are not "
            "multiples of the tile)")


def softmax_intensity(answer, R: int, C: int) -> Verdict:
    """Arithmetic intensity (FLOP per byte of global traffic) of kernels/softmax_rows.cu on an
    (R, C) input, with the FLOPs traffic.softmax_rows counts: 5 per element in all, both passes
    together (the kernel's header says the same)."""
    t = traffic.softmax_rows(R, C)
    per = t.flops / (R * C)  # FLOPs per element, in all
    once = t.flops / (traffic.BYTES * 2 * R * C)
    return close(answer, t.flops / t.bytes, "the intensity", 0.01, hints=[
        (once, "the kernel reads x twice (the online max/sum pass, then the output pass)"),
        (t.flops / (t.bytes / traffic.BYTES), "that divides by elements, not bytes"),
        (2 * t.flops / t.bytes, f"the bytes are right ({t.bytes / (R * C):g} per element) but "
                                f"the FLOPs are doubled: the model counts {per:g} FLOPs per "
                                "element in all, both passes together, not per pass"),
        (2 * t.flops / (traffic.BYTES * 2 * R * C),
         f"that counts {per:g} FLOPs per element per pass and x read once: the model counts "
         f"{per:g} per element in all, and x is read twice"),
    ], hint=f"intensity = FLOPs / (bytes read + bytes written), {per:g} FLOPs per element")


def compute_bound_tile(answer, device: str = "A100", size: int = 4096) -> Verdict:
    """The smallest tile T at which sgemm_tiled (M = N = K = size) reaches the ridge point of
    `device` in fp32, i.e. stops being memory-bound on the roofline."""
    ridge = roofline.ridge_point(device, "fp32")

    def intensity(T):
        t = traffic.sgemm_tiled(size, size, size, tile=T)
        return t.flops / t.bytes

    want = next(T for T in range(1, size + 1) if intensity(T) >= ridge)
    if unanswered(answer):
        return Verdict(NOT_YET)
    got, bad = number(answer, "the tile size")
    if bad:
        return bad
    if got != int(got) or got < 1:
        return wrong(f"a tile size is a positive whole number; you gave {answer!r}")
    if got == want:
        return right()
    name = roofline.spec(device)["name"]
    got_i = intensity(int(got))
    if got_i < ridge:
        return wrong(f"at T={int(got)} the kernel does {got_i:.3g} FLOP/byte, below the ridge "
                      f"of the {name} ({ridge:.3g} FLOP/byte): it is still memory-bound")
    return wrong(f"T={int(got)} is compute-bound ({got_i:.3g} FLOP/byte) but a smaller tile "
                  "is too: the question asks for the smallest")


def free_flops(answer, R: int, C: int, device: str = "H100") -> Verdict:
    """How many times its FLOPs softmax_rows could execute at the same modeled time on
    `device` (fp32), before the compute roof, not memory, bounds it: ridge / intensity."""
    t = traffic.softmax_rows(R, C)
    want = roofline.ridge_point(device, "fp32") / (t.flops / t.bytes)
    return close(answer, want, "the factor", 0.02, hint="the time stays bytes / bandwidth until "
                  "FLOPs / peak catches up: the factor is the ridge point over the intensity")


# ------------------------------------------------------------------------------ edit a kernel

RACE_LINE = "__syncthreads();  // everyone is done reading before the next k-tile overwrites them"


def racy_sgemm_source() -> str:
    """kernels/sgemm_tiled.cu with its second __syncthreads() taken out: a fast thread stages
    the next k-tile of A and B while slower ones still read the current one."""
    src = device.kernel_source("sgemm_tiled.cu")
    if RACE_LINE not in src:
        raise RuntimeError("kernels/sgemm_tiled.cu changed: its second barrier was not found")
    return src.replace(RACE_LINE, "// (a barrier was here)")


def race_fixed(answer) -> Verdict:
    """The learner's edit of racy_sgemm_source(), run on the emulator (race check on) at an odd
    size: right if no race, C equals A B within fp32 rounding, and the bytes are still those of
    the tiled kernel (traffic.sgemm_tiled), i.e. the fix kept the shared-memory tiles."""
    if unanswered(answer):
        return Verdict(NOT_YET)
    if not isinstance(answer, str):
        return wrong(f"the answer is the kernel source, a str; you gave {type(answer).__name__}")
    if answer == racy_sgemm_source():
        return wrong("that is the racy source unchanged: add the missing barrier")
    M, N, K = 37, 29, 45  # not multiples of the tile: the tails run too
    g = np.random.default_rng(11)
    A, B = g.standard_normal((M, K), dtype=np.float32), g.standard_normal((K, N), dtype=np.float32)
    C = np.full((M, N), np.nan, dtype=np.float32)
    T = traffic.SGEMM_TILE
    try:
        f = emu.RawModule(code=answer, options=(f"-I{device.KERNELS_DIR}",)).get_function(
            "sgemm_tiled")
        with emu.settings(mode="counted", race_check=True), emu.record() as rec:
            f((-(-N // T), -(-M // T)), (T, T), (A, B, C, np.int32(M), np.int32(N), np.int32(K)))
    except emu.EmuCompileError as e:  # before EmuError, its base: not a race, an edit that
        return wrong(compile_error(answer, str(e)))  # does not compile
    except emu.EmuError as e:
        return wrong(f"the emulator still reports: {e}")
    except Exception as e:  # a missing kernel, a bad launch: the learner's edit
        return wrong(f"the kernel did not build or launch: {type(e).__name__}: "
                     f"{str(e).strip()[:400]}")
    truth = A.astype(np.float64) @ B.astype(np.float64)
    err = float(np.linalg.norm(C - truth) / np.linalg.norm(truth)) if np.isfinite(C).all() \
        else float("inf")
    if not err < 1e-5:  # fp32 sums of 45 products: ~1e-7 relative
        return wrong(f"no race now, but C is wrong (relative error {err:.2g} against float64)")
    model = traffic.sgemm_tiled(M, N, K)
    got = rec.global_read_bytes + rec.global_write_bytes
    if got != model.bytes:
        return wrong(f"C is right but the kernel moves {got:,} bytes, not the tiled kernel's "
                     f"{model.bytes:,}: keep the shared-memory tiles and add the barrier")
    return right()


COMPILER_LINE = re.compile(r"^(?P<file>[^:\s]+):(?P<line>\d+):(?:\d+:)? (?:fatal )?error: "
                           r"(?P<what>.*)$", re.M)


def compile_error(source: str, message: str, context: int = 1) -> str:
    """A compiler's failure said in the learner's terms: the first error, at its line of
    `source` (the lines before it too: a missing ';' is reported on the next line), without the
    command line or the build folder's paths. `message` is the compiler's output (an
    EmuCompileError's text); errors in `source` are reported as <string>:LINE."""
    errors = list(COMPILER_LINE.finditer(message))
    if not errors:
        tail = [x for x in message.splitlines() if x.strip() and not x.startswith("$ ")]
        return "your kernel does not compile: " + (tail[-1].strip()[:200] if tail else "?")
    mine = [m for m in errors if m["file"] == "<string>"]
    first = (mine or errors)[0]
    where = "your source" if mine else Path(first["file"]).name  # not the build folder's path
    line = int(first["line"])
    what = re.sub(r"; did you mean '?emu_\w+'?\?", "", first["what"].strip())  # the shim's
    out = [f"your kernel does not compile: line {line} of {where}: {what}"]  # own names
    if mine:
        lines = source.splitlines()
        for k in range(max(1, line - context), min(len(lines), line) + 1):
            out.append(f"  {'>' if k == line else ' '} {k:3d} | {lines[k - 1].rstrip()}")
    return "\n".join(out)


def sgemm_tile_report(tile: int, arch: str = "sm_80") -> dict:
    """ptxas' report (registers, static shared memory 'smem' in bytes, spills) for sgemm_tiled
    compiled with TILE = tile by NVIDIA's compiler (ckptlab.kernels.nvrtc). Raises
    nvrtc.CompilerNotFound, whose message says what to install, when there is no compiler."""
    from ckptlab.kernels import nvrtc

    (record,) = nvrtc.compile_file(device.KERNELS_DIR / "sgemm_tiled.cu", arch,
                                   defines={"TILE": int(tile)})
    return record


def sgemm_shared_bytes(answer, tile: int = 32) -> Verdict:
    """Static shared memory (bytes per block) of sgemm_tiled at TILE = tile: the tiles As and Bs,
    TILE x TILE floats each. Checked against the compiler's report when NVRTC or nvcc is here,
    else against that count from the source."""
    want = 2 * tile * tile * traffic.BYTES
    try:
        want = sgemm_tile_report(tile)["smem"]
    except Exception:  # no compiler on this machine: the count from the source stands
        pass
    return exact(answer, want, "the byte count", hints=[
        (tile * tile * traffic.BYTES, "that is one tile: the block stages a tile of A (As) and "
                                      "one of B (Bs)"),
        (2 * tile * tile, "that counts floats: 4 bytes each"),
        (2 * 16 * 16 * traffic.BYTES, "that is TILE = 16, the file's default"),
    ], hint="__shared__ float As[TILE][TILE], Bs[TILE][TILE]")

