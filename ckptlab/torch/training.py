"""What one training run of the demos is (ckptlab.torch.demo with DDP, ckptlab.torch.fsdp with
FSDP2): the model, batch and schedule, and how close two runs' losses must be."""

from __future__ import annotations

from dataclasses import dataclass

# fp32 losses of the same model on the same batch, summed in another order (per-rank means,
# averaged gradients): measured differences are ~1e-7 relative; 1e-5 leaves room for the steps
TOLERANCE = 1e-5


@dataclass
class Config:
    steps: int = 3
    schedule: str = "optimal(40%)"
    layers: int = 4
    width: int = 32
    heads: int = 2
    seq: int = 32
    batch: int = 8  # global: split evenly over the ranks
    vocab: int = 64
    lr: float = 0.1
    attn: str = "flash"
    seed: int = 0
