"""Worked solutions of labs/11_activations_at_scale.ipynb (try the exercises first).
tests/test_exercises.py holds them to ckptlab's checkers."""

# Exercise 1. s b h (34 + 5 a s / h) = 2048 * 12288 * (34 + 5 * 96 * 2048 / 12288)
#           = 2048 * 12288 * (34 + 80) = 2,868,903,936 bytes, 2.7 GiB per layer (256 GiB for 96).
answer_1 = 2048 * 1 * 12288 * (34 + 5 * 96 * 2048 // 12288)

# Exercise 2. Selective recompute drops the 5 a s / h = 80 part: 80 / 114 = 0.70.
answer_2 = 80 / 114

# Exercise 3. Llama 3 8B, s = 8192, b = 1, h = 4096, 32 heads, 8 key/value heads of d = 128,
# SwiGLU width 14336, FlashAttention, 2 bytes a value:
#   the two RMSNorms' inputs and outputs   4 s b h              = 4 * 8192 * 4096
#   Q and the attention output             2 s b h
#   K and V, 8 heads of 128 each           2 s b (8 * 128)
#   SwiGLU: w1's output, SiLU's output, w3's output, the product   4 s b 14336
#   all at 2 bytes, and the logsumexp, 4 bytes a head and query:  4 * 32 * 8192
answer_3 = 2 * 8192 * (4 * 4096 + 2 * 4096 + 2 * 8 * 128 + 4 * 14336) + 4 * 32 * 8192
