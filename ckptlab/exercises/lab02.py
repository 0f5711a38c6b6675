"""Checkers of labs/02_naive_attention.ipynb (naive attention), one function per exercise.

The expected values come from ckptlab itself (the traffic models, the roofline, the float64
reference), never typed in, so an exercise follows the kernels if they change.
"""

from __future__ import annotations

from ckptlab.exercises.verdict import Verdict, exact
from ckptlab.exercises.write import in_notebook as write_kernel  # noqa: F401 (the labs' kernel cells)
from ckptlab.kernels import table
from ckptlab.measure import traffic
from ckptlab.measure.plots import fit_loglog_slope


def _nn_traffic(launches, names=("S", "P")) -> int:
    return sum(x.read.get(n, 0) + x.write.get(n, 0) for x in launches for n in names)


def naive_nn_bytes(answer, B: int, H: int, N: int, d: int) -> Verdict:
    """HBM bytes read from and written to S and P (the N x N matrices) by the three launches of
    the naive forward, for q, k, v of shape (B, H, N, d)."""
    want = _nn_traffic(traffic.naive_forward_traffic(B, H, N, N, d))
    nn = traffic.BYTES * B * H * N * N
    return exact(answer, want, "the byte count", hints=[
        (2 * nn, "that is S and P written once each: they are also read back"),
        (4 * nn, "S is written once and read twice and P written once, but P V reads P once for "
                 f"every {table.NAIVE_TILE}-wide column tile of O: ceil(d/16) times"),
        (want / traffic.BYTES, "that counts elements: fp32 is 4 bytes each"),
    ], hint="count per matrix: S written by the scores kernel, read by both softmax passes; P "
            "written by the softmax, read by P V once per column tile of O")


def naive_saved_bytes(answer, B: int = 64, H: int = 16, N: int = 1024, d: int = 64) -> Verdict:
    """Bytes the naive forward keeps for its backward (P) at (B, H, N, d): by default GPT-2
    medium's attention in the FlashAttention paper's Fig. 2."""
    want = traffic.naive_forward_traffic(B, H, N, N, d)[1].write["P"]  # the softmax writes all of P
    return exact(answer, want, "the byte count", hints=[
        (2 * want, "S is a temporary: only P is kept for the backward"),
        (want / traffic.BYTES, "that counts elements: fp32 is 4 bytes each"),
    ], hint="P has shape (B, H, N, N)")


def traffic_exponent(answer, d: int = 64) -> Verdict:
    """The exponent p in: the naive forward + backward's HBM bytes grow as N^p at large N and
    fixed d (as a whole number)."""
    ns = [2**13, 2**14]
    tot = [traffic.totals(traffic.naive_forward_traffic(1, 1, n, n, d)
                          + traffic.naive_backward_traffic(1, 1, n, n, d))["bytes"] for n in ns]
    want = round(fit_loglog_slope(ns, tot))
    return exact(answer, want, "the exponent", hints=[
        (1, "1 would mean only N x d arrays move; S, P, dP and dS are N x N"),
    ], hint="what shape do S and P have?")

