"""ckptlab: a lab about recomputation. Store less, recompute more.

Layers (DESIGN.md): labs/CLI -> checkpoint/schedules -> autograd/ops -> attention -> device -> emu;
reference (float64 truths) and measure/traffic (timers, bytes, FLOPs) on the side.
"""

__version__ = "0.1.0"
