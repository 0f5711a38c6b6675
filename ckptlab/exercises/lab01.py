"""Checkers of labs/01_roofline.ipynb (the roofline), one function per exercise.

The expected values come from ckptlab itself (the traffic models, the roofline, the float64
reference), never typed in, so an exercise follows the kernels if they change.
"""

from __future__ import annotations

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
from ckptlab.measure import roofline, traffic


def sgemm_bytes(answer, M: int, N: int, K: int) -> Verdict:
    """Global bytes (read + written) of kernels/sgemm_tiled.cu computing C (M, N) = A (M, K)
    B (K, N), fp32, 16 x 16 tiles."""
    t = traffic.sgemm_tiled(M, N, K)
    once = traffic.BYTES * (M * K + K * N + M * N)
    return exact(answer, t.bytes, "the byte count", hints=[
        (once, "that counts A, B and C once each: the tiled kernel loads a tile of A again for "
               "every column tile of C (ceil(N/16) times) and of B for every row tile"),
        (t.bytes_read, "that is the reads alone: C is written too"),
        (t.bytes / traffic.BYTES, "that counts elements: an fp32 element is 4 bytes"),
    ], hint=f"A is read ceil(N/{traffic.SGEMM_TILE}) times, B ceil(M/{traffic.SGEMM_TILE}) "
            "times, C written once")


def softmax_intensity(answer, R: int, C: int) -> Verdict:
    """Arithmetic intensity (FLOP per byte of global traffic) of kernels/softmax_rows.cu on an
    (R, C) input, with the FLOPs traffic.softmax_rows counts (5 per element)."""
    t = traffic.softmax_rows(R, C)
    once = t.flops / (traffic.BYTES * 2 * R * C)
    return close(answer, t.flops / t.bytes, "the intensity", 0.01, hints=[
        (once, "the kernel reads x twice (the online max/sum pass, then the output pass)"),
        (t.flops / (t.bytes / traffic.BYTES), "that divides by elements, not bytes"),
    ], hint="intensity = FLOPs / (bytes read + bytes written)")


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
