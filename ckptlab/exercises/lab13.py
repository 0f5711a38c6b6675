"""Checkers of labs/13_offload_or_recompute.ipynb (offloading activations to host memory
against recomputing them), one function per exercise.

The expected values come from ckptlab itself (ckptlab.cluster.offload and at_scale), never
typed in.
"""

from __future__ import annotations

from ckptlab.cluster import at_scale, offload
from ckptlab.exercises.verdict import Verdict, close


def copy_ms(answer, link: str, s: int, b: int, h: int, a: int) -> Verdict:
    """Milliseconds to copy one layer's offloaded activations (everything it holds with no
    recompute but its input: offload.offloaded_bytes) one way over `link`, at the link's
    signalling rate (offload.LINKS)."""
    nbytes = offload.offloaded_bytes(s, b, h, a)
    want = 1e3 * offload.copy_seconds(nbytes, link)
    whole = at_scale.layer_activation_bytes(s, b, h, a, "none")
    return close(answer, want, "the time", 0.02, hints=[
        (1e3 * offload.copy_seconds(whole, link), "the layer's input stays on the GPU: the "
                                                  "next layer's output, kept for its backward"),
        (2 * want, "the question asks for one way; the copy back is the same again"),
        (want / 1e3, "the answer is in milliseconds"),
    ], hint="bytes over bandwidth: which of the layer's bytes go over the link, and how fast?")


def break_even_gbps(answer, s: int, b: int, h: int, a: int, device: str = "H100") -> Verdict:
    """The link bandwidth (GB/s per direction, 1e9 bytes) at which one layer's offloaded bytes
    go out in exactly its forward's modeled time on `device` (offload.break_even_bandwidth):
    from it up the copy hides behind compute."""
    want = offload.break_even_bandwidth(s, b, h, a, device) / 1e9
    fwd, bwd = offload.layer_seconds(s, b, h, device)
    nbytes = offload.offloaded_bytes(s, b, h, a)
    return close(answer, want, "the bandwidth", 0.02, hints=[
        (nbytes / bwd / 1e9, "the copy out hides behind the forward, which is the shorter "
                             "of the two passes: it sets the bandwidth needed"),
        (want * 2**30 / 1e9, "GB/s here are 1e9 bytes a second"),
        (at_scale.layer_activation_bytes(s, b, h, a, "none") / fwd / 1e9,
         "the layer's input stays on the GPU: it is not copied"),
    ], hint="the copy out must take no longer than the layer's forward")
