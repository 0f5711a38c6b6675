"""Worked solutions of labs/11_activations_at_scale.ipynb (try the exercises first).
tests/test_exercises.py holds them to ckptlab's checkers."""

# Exercise 1. s b h (34 + 5 a s / h) = 2048 * 12288 * (34 + 5 * 96 * 2048 / 12288)
#           = 2048 * 12288 * (34 + 80) = 2,868,903,936 bytes, 2.7 GiB per layer (256 GiB for 96).
answer_1 = 2048 * 1 * 12288 * (34 + 5 * 96 * 2048 // 12288)

# Exercise 2. Selective recompute drops the 5 a s / h = 80 part: 80 / 114 = 0.70.
answer_2 = 80 / 114
