"""Standard attention as training runs launch it, modeled: the scores, the probabilities and
their dropout each go through HBM, one launch after another. Every number here is *modeled*.

Megatron-LM's CoreAttention (megatron/model/transformer.py, 2021-22: what the runs of
ckptlab.cluster.published_runs ran) and PyTorch's math attention (torch.matmul, softmax,
dropout, matmul) launch the same sequence. Per head of one sequence, with N = s^2 scores,
w-byte values (2: bf16 / fp16), the dropout mask 1 byte a score:

  forward                                    reads                    writes
    S = Q K^T / sqrt(d)   batched GEMM         Q, K: 2 s d w            S: N w  (beta 0)
    P = softmax(mask(S))  fused kernel         S: N w                   P: N w
    P' = dropout(P)       dropout              P: N w                   P': N w, mask: N
    O = P' V              batched GEMM         P': N w, V: s d w        O: s d w
  backward
    dP' = dO V^T          batched GEMM         dO, V: 2 s d w           dP': N w
    dV = P'^T dO          batched GEMM         P': N w, dO: s d w       dV: s d w
    dP = dP' mask / keep  dropout backward     dP': N w, mask: N        dP: N w
    dS = P (dP - D)       softmax backward     P, dP: 2 N w             dS: N w
    dQ = dS K             batched GEMM         dS: N w, K: s d w        dQ: s d w
    dK = dS^T Q           batched GEMM         dS: N w, Q: s d w        dK: s d w

(beta 0: the GEMM does not read its output buffer.) So 6w + 1 bytes a score forward and 9w + 1
backward (13 and 19 at w = 2) beside the four GEMMs' 2 N d FLOPs each; without dropout its two
launches go (P is used where P' was). Every
score is computed and written, causal or not (Megatron's upper-triangular masked softmax writes
the masked ones as zeros). The saved tensors, P, the mask and P' (5 a s^2 b at w = 2), are
Korthikanti et al.'s (ckptlab.cluster.step_memory).

A launch takes timemodel.LAUNCH_S plus the roofline, max(FLOPs / (achievable x peak),
bytes / bandwidth): these launches are large enough to fill their waves (b a s^2 elements).
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptlab.measure import roofline, timemodel


@dataclass(frozen=True)
class Launch:
    """One launch of a layer's attention core on one GPU (all heads at once)."""

    name: str
    flops: float
    read: float  # bytes
    write: float

    @property
    def bytes(self) -> float:
        return self.read + self.write


def launches(b: int, heads: int, s: int, d: int, w: int = 2, dropout: bool = True,
             part: str = "forward") -> list[Launch]:
    """The launches of the module docstring for `heads` heads of b sequences of length s, head
    dim d; `part` "forward" or "backward"."""
    for name, val in (("b", b), ("heads", heads), ("s", s), ("d", d), ("w", w)):
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise ValueError(f"{name}: expected a positive int, got {val!r}")
    if part not in ("forward", "backward"):
        raise ValueError(f"part: expected 'forward' or 'backward', got {part!r}")
    n = b * heads * s * s  # scores
    x = b * heads * s * d  # elements of one of Q, K, V, O (and their gradients)
    gemm = 2 * n * d
    if part == "forward":
        out = [Launch("S = Q K^T", gemm, 2 * x * w, n * w),
               Launch("P = softmax(S)", 0, n * w, n * w)]
        if dropout:
            out.append(Launch("P' = dropout(P)", 0, n * w, n * w + n))
        out.append(Launch("O = P' V", gemm, n * w + x * w, x * w))
        return out
    out = [Launch("dP' = dO V^T", gemm, 2 * x * w, n * w),
           Launch("dV = P'^T dO", gemm, n * w + x * w, x * w)]
    if dropout:
        out.append(Launch("dP = dropout'(dP')", 0, n * w + n, n * w))
    return out + [Launch("dS = P (dP - D)", 0, 2 * n * w, n * w),
                  Launch("dQ = dS K", gemm, n * w + x * w, x * w),
                  Launch("dK = dS^T Q", gemm, n * w + x * w, x * w)]


def launch_s(launch: Launch, peak_flops: float, hbm_bytes_per_s: float) -> float:
    return timemodel.LAUNCH_S + max(launch.flops / peak_flops, launch.bytes / hbm_bytes_per_s)


def seconds(b: int, heads: int, s: int, d: int, gpu, dtype: str = "bf16",
            achievable: float = 1.0, dropout: bool = True) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's attention core (`heads` heads on one GPU)."""
    if not (isinstance(achievable, (int, float)) and 0 < achievable <= 1):
        raise ValueError(f"achievable: expected a fraction in (0, 1], got {achievable!r}")
    if dtype not in timemodel.DTYPES:
        raise ValueError(f"dtype: expected one of {sorted(timemodel.DTYPES)}, got {dtype!r}")
    w = timemodel.DTYPES[dtype]
    spec = roofline.spec(gpu)
    peak = achievable * roofline.peak_flops(spec, dtype)
    return tuple(sum(launch_s(x, peak, spec["hbm_bytes_per_s"])
                     for x in launches(b, heads, s, d, w, dropout, part))
                 for part in ("forward", "backward"))
