"""Worked solutions of labs/13_offload_or_recompute.ipynb, derived by hand from Korthikanti et
al.'s per-layer count, the layer's matmul FLOPs and the links' signalling rates (try the
exercises first). tests/test_exercises.py holds them to ckptlab's checkers."""

s, b, h, a = 2048, 1, 12288, 96  # GPT-3 175B, one layer
PCIE5 = 16 * 32e9 * 128 / 130 / 8  # bytes/s per direction: 16 lanes, 32 GT/s, 128b/130b
H100_BF16 = 989e12  # FLOP/s, dense BF16 on the H100 SXM's tensor cores (datasheet)

# What an offload copies: the layer's activations with no recompute, s b h (34 + 5 a s / h),
# less its input (2 s b h), which stays on the GPU: s b h (32 + 80) = 112 s b h bytes.
offloaded = s * b * h * (34 + 5 * a * s // h - 2)  # 2,818,572,288 bytes

# Exercise 1. One way over PCIe 5.0 x16: bytes / bandwidth = 2.82e9 / 63.0e9 s = 44.7 ms.
answer_1 = 1e3 * offloaded / PCIE5

# Exercise 2. The layer's forward: 24 b s h^2 + 4 b s^2 h matmul FLOPs at the bf16 peak,
# 7.62e12 / 989e12 = 7.71 ms; the copy out fits in it from offloaded / t_fwd = 366 GB/s up.
t_fwd = (24 * b * s * h * h + 4 * b * s * s * h) / H100_BF16
answer_2 = offloaded / t_fwd / 1e9
