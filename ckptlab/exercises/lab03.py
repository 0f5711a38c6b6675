"""Checkers of labs/03_store_p_backward.ipynb (the store-P backward), one function per exercise.

The expected values come from ckptlab itself (the traffic models, the roofline, the float64
reference), never typed in, so an exercise follows the kernels if they change.
"""

from __future__ import annotations

import numpy as np

from ckptlab import reference
from ckptlab.exercises.verdict import Verdict, array, call, exact, rel_err, right, wrong
from ckptlab.exercises.write import in_notebook as write_kernel  # noqa: F401 (the labs' kernel cells)
from ckptlab.measure import traffic


def softmax_backward(fn) -> Verdict:
    """fn(P, dP) -> dS for one head: P = softmax(S) row-wise and dP = dL/dP, both (Nq, Nk)
    NumPy arrays; dS = dL/dS. Checked through dQ = scale dS K against reference.backward."""
    g = np.random.default_rng(6)
    Nq, Nk, d = 7, 9, 4
    q, k, v, dO = (g.standard_normal((1, 1, n, d)) for n in (Nq, Nk, Nk, Nq))
    P, _ = reference.probabilities(q, k)  # (1, 1, Nq, Nk)
    dP = dO @ np.swapaxes(v, -1, -2)  # (1, 1, Nq, Nk): dP = dO V^T
    dQ, _, _ = reference.backward(dO, q, k, v)
    out, bad = call(fn, P[0, 0].copy(), dP[0, 0].copy())
    if bad:
        return bad
    dS, bad = array(out, (Nq, Nk), "dS")
    if bad:
        return bad
    # float64 all through: only a wrong formula misses by more than 1e-10
    if rel_err(reference.default_scale(d) * dS @ k[0, 0], dQ[0, 0]) <= 1e-10:
        return right()
    P2, dP2 = P[0, 0], dP[0, 0]
    if np.allclose(dS, P2 * dP2):
        return wrong("each row of dS must sum to 0 (adding a constant to a row of S leaves P "
                      "unchanged), and yours do not: which part of the softmax's Jacobian, the "
                      "one that comes from its normalisation, is missing?")
    D = (P2 * dP2).sum(axis=1, keepdims=True)
    if np.allclose(dS, dP2 - D):
        return wrong("your rows sum to 0 now, but dS is not scaled like P: the softmax's "
                      "Jacobian dP_ij/dS_ik carries a factor P_ij. Where does it enter?")
    return wrong("dQ = scale dS K built from your dS does not match the float64 reference; "
                  "differentiate P_ij = exp(S_ij) / sum_k exp(S_ik) with respect to S_ij")


def store_p_reads(answer, B: int, H: int, N: int, d: int) -> Verdict:
    """HBM bytes the store-P backward (five launches) reads from the saved P, for q, k, v of
    shape (B, H, N, d)."""
    launches = traffic.naive_backward_traffic(B, H, N, N, d)
    want = sum(x.read.get("P", 0) for x in launches)
    nn = traffic.BYTES * B * H * N * N
    return exact(answer, want, "the byte count", hints=[
        (nn, "P is read by two kernels, and more than once by each"),
        (3 * nn, "dV = P^T dO reads P once for every 16-wide column tile of dV (ceil(d/16) "
                 "times), and dS reads it twice (one pass for D, one for dS)"),
        (want / traffic.BYTES, "that counts elements: fp32 is 4 bytes each"),
    ], hint="which launches take P? attn_naive_bwd_dv (a tiled matmul) and attn_naive_bwd_ds "
            "(two passes)")

