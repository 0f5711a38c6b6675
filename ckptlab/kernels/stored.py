"""Launch wrappers for the fused store-P pair: the flash kernels with STORED = true
(kernels/attn_flash_fwd.cu, _bwd.cu), the middle method of the controlled experiment.

    O, saved = stored_forward(q, k, v, causal=False, scale=None, dropout_p=0.0, seed=0, offset=0)
    dq, dk, dv = stored_backward(dO, q, k, v, saved, deterministic=False)

naive (unfused, S and P through HBM) -> stored (fused, flash tiles, S written once by the
forward and read back) -> flash (fused, the same tiles, P recomputed from L). The forward keeps
O, L and the scores S (B, H, Nq, Nk), written on the visible (i, j) only (masked entries stay
unwritten); it stores S rather than P because L, which P = exp(S - L) needs, is known only
when the single pass ends. The backward reads S back and never runs Q K^T. Same arrays,
options, checks and errors as flash.py.
"""

from __future__ import annotations

from ckptlab.kernels.flash import fused_backward, fused_forward


def stored_forward(q, k, v, causal=False, scale=None, dropout_p=0.0, seed=0, offset=0, *,
                   tiles=None):
    """The flash forward that also writes S (B, H, Nq, Nk); keeps O, L and S."""
    return fused_forward("stored", q, k, v, causal, scale, dropout_p, seed, offset, tiles)


def stored_backward(dO, q, k, v, saved, deterministic=False, *, tiles=None):
    """The flash backward with P = exp(S - L) formed from the stored S instead of recomputing
    S = scale Q K^T; dQ by atomicAdd, or deterministic=True for the second, atomic-free
    kernel."""
    return fused_backward("stored", dO, q, k, v, saved, deterministic, tiles)
