"""ZeRO-3 / FSDP as its two implementations run it: how much of the parameter all-gathers and
gradient reduce-scatters hides behind compute, and what the gathered parameters hold. Every
number here is *modeled*.

The unit: one transformer layer (PyTorch FSDP's transformer auto-wrap policy, or fully_shard on
each block, as torchtitan and llm-foundry wrap; DeepSpeed fetches per module, a layer at a
time); the embeddings, final norm and head are the root's, gathered once a micro-batch.

Time, per micro-batch, for each of a stage's n layers (gather g, reduce-scatter r of one layer,
at the link's achieved rate: ckptlab.cluster.links; its forward f and backward b compute):
  "fsdp"       PyTorch FSDP: one unit prefetched ahead (FSDP1's BACKWARD_PRE and its CPU
               running ahead with limit_all_gathers, FSDP2's implicit prefetch), so the
               next unit's gather overlaps this unit's compute: exposed max(0, g - f) a layer
               forward, max(0, g + r - b) backward; the first gather (the root's and the first
               layer's) and the root's reduce-scatter, last, wait with nothing to hide behind.
  "deepspeed"  DeepSpeed ZeRO-3: parameters fetched ahead up to stage3_prefetch_bucket_size
               elements (default 5e7; deepspeed/runtime/zero/config.py), so only the fraction
               q = min(1, bucket / layer parameters) of the next layer's gather overlaps: exposed
               (1 - q) g + max(0, q g - f) forward, (1 - q) g + max(0, q g + r - b) backward,
               the same first gather and root reduce-scatter.
Memory beyond the shards (step_memory's transients):
  "fsdp"       the unit being computed and the one prefetched, gathered, and the unit's
               unsharded gradients before their reduce-scatter: (2 param + grad) x layer.
  "deepspeed"  gathered parameters up to a layer plus the prefetch bucket, never more than
               stage3_max_live_parameters (default 1e9), and the gradient bucket reduced at once
               (reduce_bucket_size, default 5e8 elements), at most the stage's parameters.
"""

from __future__ import annotations

IMPLEMENTATIONS = ("fsdp", "deepspeed")
DEEPSPEED = dict(prefetch_bucket=50_000_000, max_live=1_000_000_000, reduce_bucket=500_000_000)


def check(impl: str) -> str:
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"zero3: expected one of {IMPLEMENTATIONS}, got {impl!r}")
    return impl


def overlapped(impl: str, layer_params: int) -> float:
    """q: the fraction of the next layer's gather that can run during this layer's compute."""
    if check(impl) == "fsdp":
        return 1.0
    return min(1.0, DEEPSPEED["prefetch_bucket"] / max(1, layer_params))


def exposed_s(impl: str, n: int, layer_params: int, gather: float, scatter: float,
              root_gather: float, root_scatter: float, forward: float,
              backward: float) -> float:
    """Seconds of ZeRO-3 communication a micro-batch waits for on a stage of n layers: gather
    and scatter of one layer, of the root, the stage's forward and backward compute (spread
    evenly over its layers)."""
    if n < 1:
        return root_gather + root_scatter
    q = overlapped(impl, layer_params)
    f, b = forward / n, backward / n
    fwd = (1 - q) * gather + max(0.0, q * gather - f)
    bwd = (1 - q) * gather + max(0.0, q * gather + scatter - b)
    first = root_gather + gather  # nothing computes before the first gathers land
    # each layer's reduce-scatter overlaps the backward after it; the root's, last, waits
    return first + (n - 1) * fwd + n * bwd + root_scatter


def transient_bytes(impl: str, layer_params: int, stage_params: int, param: int,
                    grad: int) -> int:
    """Bytes the gathered parameters and unsharded gradients hold beyond the shards."""
    if check(impl) == "fsdp":
        return layer_params * (2 * param + grad)
    live = min(layer_params + DEEPSPEED["prefetch_bucket"], DEEPSPEED["max_live"])
    return live * param + min(DEEPSPEED["reduce_bucket"], stage_params) * grad
