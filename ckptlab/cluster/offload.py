"""CPU offload, the other way to trade GPU memory, modeled beside recompute on paper.

Instead of recomputing a layer's activations, copy them to host memory during the forward and
back before the layer's backward. The copy costs no FLOPs but link time: bytes / bandwidth of
the link between GPU and host, a third roof beside FLOP/s and HBM bandwidth. It is free while it
hides behind the layer's own compute (copy out during the next layer's forward, prefetch during
the previous layer's backward), and exposed beyond that:

    exposed out = max(0, bytes / link - t_forward),  exposed in = max(0, bytes / link - t_backward)

Recompute, on the same roofline, costs its FLOPs at the tensor-core peak: recompute / peak.
Both are modeled at peak (compute at 100% of the tensor cores, links at their signalling rate),
so they are lower bounds on time: a real step, at 40-60% MFU, hides more of the copy.

Links, per direction (sources beside each; theoretical rates, achieved ones are ~80% of them):
"""

from __future__ import annotations

from ckptlab.cluster import at_scale
from ckptlab.measure import roofline

LINKS = {
    # PCIe 4.0: 16 GT/s per lane, 128b/130b encoding (PCI-SIG, PCI Express Base Specification
    # 4.0); x16 = 16 * 16e9 * 128/130 / 8 = 31.5 GB/s per direction. A100 PCIe datasheet:
    # "PCIe Gen4: 64 GB/s" (both directions).
    "PCIe 4.0 x16": 16 * 16e9 * 128 / 130 / 8,
    # PCIe 5.0: 32 GT/s per lane, same encoding (PCI-SIG, Base Specification 5.0): 63.0 GB/s.
    # H100 datasheet: "PCIe Gen5: 128 GB/s" (both directions).
    "PCIe 5.0 x16": 16 * 32e9 * 128 / 130 / 8,
    # NVLink-C2C between Grace and Hopper (NVIDIA GH200 Grace Hopper Superchip datasheet and
    # architecture whitepaper): "900 GB/s total bandwidth", 450 GB/s per direction.
    "NVLink-C2C (GH200)": 450e9,
}


def _check_link(link: str) -> float:
    if link not in LINKS:
        raise ValueError(f"link: expected one of {sorted(LINKS)}, got {link!r}")
    return LINKS[link]


def copy_seconds(nbytes: float, link: str) -> float:
    """Modeled time to move `nbytes` one way over `link`: bytes / bandwidth."""
    if not nbytes >= 0:
        raise ValueError(f"nbytes: expected a non-negative byte count, got {nbytes!r}")
    return nbytes / _check_link(link)


def layer_seconds(s: int, b: int, h: int, device: str = "H100") -> tuple[float, float]:
    """(forward, backward) modeled compute time of one layer at the 16-bit tensor-core peak:
    forward = layer_forward_flops / peak, backward = twice that."""
    fwd = at_scale.layer_forward_flops(s, b, h) / roofline.peak_flops(device, "bf16")
    return fwd, 2 * fwd


def offload_exposed(nbytes: float, link: str, s: int, b: int, h: int,
                    device: str = "H100") -> float:
    """Seconds per layer a copy of `nbytes` out (during the forward) and back (during the
    backward) adds beyond what the layer's compute hides."""
    t = copy_seconds(nbytes, link)
    fwd, bwd = layer_seconds(s, b, h, device)
    return max(0.0, t - fwd) + max(0.0, t - bwd)


def offloaded_bytes(s: int, b: int, h: int, a: int) -> int:
    """What an offload copies out and back per layer: its activations (no recompute) without
    its input, which stays on the GPU (the next layer's output, kept for the backward)."""
    return (at_scale.layer_activation_bytes(s, b, h, a, "none")
            - at_scale.layer_activation_bytes(s, b, h, a, "full"))


def break_even_bandwidth(s: int, b: int, h: int, a: int, device: str = "H100") -> float:
    """Bytes/s per direction at which the bytes an offload copies (offloaded_bytes: the layer's
    activations without its input) go out in exactly its forward's time: from it up the
    offload in `table` is hidden by compute on this model."""
    fwd, _ = layer_seconds(s, b, h, device)
    return offloaded_bytes(s, b, h, a) / fwd


def table(s: int, b: int, h: int, a: int, layers: int = 1, device: str = "H100") -> list[dict]:
    """One row per way to hold a layer's activations: recompute (none, selective, full) and
    offload of everything but the layer's input over each link. held_bytes: what the GPU keeps
    for `layers` layers (offload: every layer's input, plus two layers' activations in flight,
    double-buffered); extra_s: modeled seconds per step added to `layers` layers' compute."""
    peak = roofline.peak_flops(device, "bf16")
    full = at_scale.layer_activation_bytes(s, b, h, a, "none")
    inp = full - offloaded_bytes(s, b, h, a)
    rows = []
    for r in ("none", "selective", "full"):
        rows.append(dict(choice=f"recompute: {r}", held_bytes=layers * at_scale.
                         layer_activation_bytes(s, b, h, a, r), extra_s=layers * at_scale.
                         layer_recompute_flops(s, b, h, a, r) / peak))
    for link in LINKS:
        rows.append(dict(choice=f"offload over {link}", held_bytes=layers * inp + 2 * full,
                         extra_s=layers * offload_exposed(full - inp, link, s, b, h, device)))
    fwd, bwd = layer_seconds(s, b, h, device)
    for row in rows:
        row["step_s"] = layers * (fwd + bwd) + row["extra_s"]
    return rows
