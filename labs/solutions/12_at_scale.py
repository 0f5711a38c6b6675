"""Worked solutions of labs/12_at_scale.ipynb (try the exercises first).
tests/test_exercises.py holds them to ckptlab's checkers."""

from ckptlab.measure import step_memory as sm

# Exercise 1. s b h (34 + 5 a s / h) = 2048 * 12288 * (34 + 5 * 96 * 2048 / 12288)
#           = 2048 * 12288 * (34 + 80) = 2,868,903,936 bytes, 2.7 GiB per layer (256 GiB for 96).
answer_1 = 2048 * 1 * 12288 * (34 + 5 * 96 * 2048 // 12288)

# Exercise 2. Selective recompute drops the 5 a s / h = 80 part: 80 / 114 = 0.70.
answer_2 = 80 / 114

# Exercise 3. 16 bytes a parameter (2 + 2 + 12), every one of them sharded over the 1024 GPUs:
# 16 * 174.6e9 / 1024 = 2.73e9 bytes, 2.5 GiB per GPU.
answer_3 = 16 * sm.GPTShape(96, 12288, 96, 2048, 51200).params() / 1024
