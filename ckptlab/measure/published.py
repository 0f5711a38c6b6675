"""Published measurements of attention on an A100 that ckptlab's time model is held against
(ckptlab.cli.model_check), each with the exact place it was printed. Only numbers printed as
numbers are here; the FlashAttention 2 paper's per-length forward + backward speeds (its Fig. 4,
"Attention forward + backward speed on A100 GPU") are bar charts whose values its text does not
give, so its own summary range (the abstract's) stands in for them.
"""

from __future__ import annotations

FA1 = ("Dao, Fu, Ermon, Rudra, Re, 'FlashAttention: Fast and Memory-Efficient Exact Attention "
       "with IO-Awareness', NeurIPS 2022, arXiv 2205.14135")
FA2 = ("Dao, 'FlashAttention-2: Faster Attention with Better Parallelism and Work "
       "Partitioning', ICLR 2024, arXiv 2307.08691")

# FA1, Fig. 2 (left): GPT-2 medium attention, forward + backward, A100, fp16.
FIG2 = dict(B=64, H=16, N=1024, d=64, causal=False, dtype="fp16",
            workload="GPT-2 medium attention (B 64, H 16, N 1024, d 64), forward + backward")
FIG2_MS = {"naive": 41.7, "flash": 7.3}  # standard attention (PyTorch), FlashAttention
FIG2_SOURCE = FA1 + ", Fig. 2 left (runtime 41.7 ms standard, 7.3 ms FlashAttention)"

# FA2, abstract: "These yield around 2x speedup compared to FlashAttention, reaching 50-73% of
# the theoretical maximum FLOPs/s on A100"; and of FlashAttention (1): "reaching only 25-40% of
# the theoretical maximum FLOPs/s". The benchmark behind it (Section 4.1): sequence lengths 512
# to 16k, batch so that batch x length = 16k tokens, hidden dimension 2048, head dimension 64 or
# 128 (32 or 16 heads), causal or not, "an A100 80GB SXM4 GPU"; FLOPs counted as 4 N^2 d H B
# forward, 2.5x that backward ("2 matmuls in the forward pass and 5 matmuls in the backward
# pass, due to recomputation"), halved when causal.
FA2_FRACTION = {"flash": (0.50, 0.73)}
FA2_FRACTION_SOURCE = (FA2 + ", abstract ('reaching 50-73% of the theoretical maximum FLOPs/s "
                       "on A100'); workloads: Section 4.1")
FA1_FRACTION = (0.25, 0.40)
FA1_FRACTION_SOURCE = (FA2 + ", abstract (FlashAttention 'reaching only 25-40% of the "
                       "theoretical maximum FLOPs/s')")
# Fig. 2's setting, as assumed (the figure names only "A100"): FlashAttention 1's benchmarks
# ran with dropout and a padding mask (its repository's README of the time: "we see more speedup
# when using dropout and masking") on an A100, taken as either variant below; the kernels timed
# here run neither dropout nor a mask, so the modeled times leave both out.
A100_VARIANTS = {"A100 80GB (2.04 TB/s)": 1.0,
                 # A100 datasheet: 40 GB HBM2 at 1,555 GB/s against the 80 GB's 2,039 GB/s;
                 # same SMs, clocks and L2, so only the memory time of each launch changes
                 "A100 40GB (1.56 TB/s)": 2039 / 1555}
FA2_GRID = dict(lengths=(512, 1024, 2048, 4096, 8192, 16384), dims=(64, 128), tokens=16384,
                hidden=2048, causal=(False, True),
                dtype="fp16")  # 16-bit: fp16 and bf16 have the same peak and bytes in the model
# The FA2 workloads the achievable fraction is calibrated on (the band's middle, 61.5% of the
# peak); the other lengths are held out and checked against the band. Named before any error
# was seen: every other length, both head dims, causal or not.
FA2_CALIBRATION_LENGTHS = (1024, 4096, 16384)


def fa2_flops(N: int, d: int, H: int, B: int, causal: bool) -> float:
    """FlashAttention 2's FLOP count of a forward + backward (its Section 4.1): 4 N^2 d H B
    forward, 2.5x that backward, halved when causal."""
    return 3.5 * 4 * N * N * d * H * B / (2 if causal else 1)
