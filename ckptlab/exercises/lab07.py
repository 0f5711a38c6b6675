"""Checkers of labs/07_tensor_cores.ipynb (tensor cores: 16-bit numbers, a warp's matrix, half
the bytes), one per exercise.

The expected values come from ckptlab itself (the traffic models of the fp32 and tensor-core
kernels, the roofline's peaks), never typed in, so an exercise follows the kernels if they
change.
"""

from __future__ import annotations

from ckptlab.exercises.verdict import Verdict, close, exact
from ckptlab.exercises.write import in_notebook as write_kernel  # noqa: F401 (the labs' kernel cells)
from ckptlab.measure import traffic, traffic_tc


def wmma_gemm_bytes(answer, M: int, N: int, K: int) -> Verdict:
    """Counted HBM bytes of kernels/wmma_gemm.cu with bf16 inputs (C = A B, A (M, K),
    B (K, N), C (M, N) fp32), one launch."""
    want = traffic.wmma_gemm(M, N, K, "__nv_bfloat16").bytes
    fp32 = traffic.sgemm_tiled(M, N, K).bytes
    all2 = want - 2 * M * N
    once = 2 * (M * K + K * N) + 4 * M * N
    return exact(answer, want, "the byte count", hints=[
        (fp32, "that is the fp32 SGEMM's count: A and B are bf16 here, 2 bytes an element"),
        (all2, "C is accumulated and written in fp32: 4 bytes an element"),
        (once, "each block loads its own tiles: A is read once per 16-column tile of C, "
               "B once per 16-row tile"),
    ], hint="the same tiling as sgemm_tiled.cu, with 2-byte inputs")


def _flash_bytes(B, H, N, d, tc: bool) -> int:
    if tc:
        runs = traffic_tc.tc_launches("flash", B, H, N, N, d, deterministic=True)
    else:
        runs = (traffic.flash_forward_traffic(B, H, N, N, d)
                + traffic.flash_backward_traffic(B, H, N, N, d, deterministic=True))
    return traffic.totals(runs)["bytes"]


def bf16_bytes_ratio(answer, B: int = 1, H: int = 1, N: int = 1024, d: int = 64) -> Verdict:
    """HBM bytes of the bf16 flash pair over the fp32 flash pair's, forward + deterministic
    backward (no atomics), not causal, at the same tiles."""
    want = _flash_bytes(B, H, N, d, True) / _flash_bytes(B, H, N, d, False)
    return close(answer, want, "the ratio", 0.001, hints=[
        (0.5, "not exactly half: L and D (one float per query row) stay fp32"),
        (0.25, "only the element size changes (4 -> 2 bytes), not the number of reads"),
    ], hint="sum each pair's bytes launch by launch: 2-byte Q, K, V, O, dO, gradients, "
            "4-byte L and D")


