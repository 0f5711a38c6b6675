"""Oracles for the PyTorch tests (tests/test_torch_*.py): attention in PyTorch itself, float64
or float32, and the skip rule for a machine without PyTorch.

For dropout_p = 0 the oracle is torch.nn.functional.scaled_dot_product_attention (math
backend), its causal mask given explicitly, aligned to the bottom-right corner as ckptlab's
(SDPA's is_causal aligns to the top-left when Nq != Nk). SDPA draws its own dropout masks, so
for dropout_p > 0 the oracle is PyTorch autograd on the same math written out, with the
Philox mask of ckptlab.rng (built independently of ckptlab.reference).
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # PyTorch missing: skipped (pip install -e '.[torch]')
import torch.nn.functional as F  # noqa: E402  (after the skip: PyTorch may be missing)
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from ckptlab import rng  # noqa: E402

# The tests' tensors are tiny: a second intra-op thread only spin-waits (4x slower measured on
# a busy 2-core machine), so PyTorch runs on one thread in the test process.
torch.set_num_threads(1)

TOL = 1e-5  # the kernels' rule (tests/test_attention.py, ckptlab/cli/check.py)
FLOOR = 2.0**-22


def visible(Nq: int, Nk: int, device="cpu") -> torch.Tensor:
    """(Nq, Nk) bool: query i sees key j iff j <= i + Nk - Nq (bottom-right aligned)."""
    i, j = torch.arange(Nq, device=device)[:, None], torch.arange(Nk, device=device)[None, :]
    return j <= i + (Nk - Nq)


def oracle(q, k, v, causal=False, dropout_p=0.0, seed=0, offset=0, scale=None):
    """O of PyTorch in the inputs' dtype, differentiable (see the module's docstring)."""
    Nq, Nk, d = q.shape[2], k.shape[2], q.shape[3]
    scale = 1 / np.sqrt(d) if scale is None else scale
    mask = visible(Nq, Nk, q.device) if causal else None
    if dropout_p == 0:
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    S = scale * q @ k.transpose(-1, -2)
    if causal:
        S = S.masked_fill(~mask, float("-inf"))
    m = S.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # rows that see no key
    E = torch.exp(S - m)
    l = E.sum(-1, keepdim=True)
    P = E / torch.where(l > 0, l, torch.ones_like(l))
    keep = torch.from_numpy(rng.keep_mask(seed, offset, tuple(P.shape), dropout_p)).to(q.device)
    return (P * keep / (1 - dropout_p)) @ v


def lse_slack(q, k, causal=False, scale=None) -> float:
    """What forming P again from the stored logsumexp costs in fp32: P_ij = exp(S_ij - L_i)
    carries L_i's rounding, an absolute error of about 2^-24 |L_i| in the exponent, so a relative
    error of that size in P and in the gradients made from it (dQ, dK, dV of stored and flash).
    An fp32 reference computing exp(S - m) / l has no such term: its exponent is S - m, near 0
    for the largest probabilities. Returned: 2^-23 max_i |L_i| (twice the rounding of L, once
    for L and once for S - L), from float64 inputs. One query row seeing 100 keys has L ~ 5.7:
    a slack of 7e-7, well under the 1e-5 rule."""
    q, k = q.detach().double(), k.detach().double()
    Nq, Nk, d = q.shape[2], k.shape[2], q.shape[3]
    scale = 1 / np.sqrt(d) if scale is None else scale
    S = scale * q @ k.transpose(-1, -2)
    if causal:
        S = S.masked_fill(~visible(Nq, Nk, q.device), float("-inf"))
    L = torch.logsumexp(S, -1)
    L = L[torch.isfinite(L)]  # rows that see no key have no P to form
    return 2.0**-23 * float(L.abs().max()) if L.numel() else 0.0


def rel(x, y) -> float:
    """Relative Frobenius error ||x - y|| / ||y|| in float64."""
    x, y = x.detach().double(), y.detach().double()
    return float((x - y).norm() / y.norm())


def rule_violation(name: str, x, truth, fp32, slack: float = 0.0):
    """Why `x` fails the kernels' rule against the float64 `truth`, or None: relative error
    <= TOL, and <= 2x the error of the same oracle in float32 (`fp32`) + FLOOR + `slack` (what
    forming P from the stored L costs: lse_slack)."""
    err, err32 = rel(x, truth), rel(fp32, truth)
    if not err <= TOL:
        return f"{name}: relative error {err:.2e} > {TOL}"
    if not err <= 2 * err32 + FLOOR + slack:
        return (f"{name}: {err:.2e} > 2x fp32's {err32:.2e} + {slack:.1e} (L's rounding)")
    return None
