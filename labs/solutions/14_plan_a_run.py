"""Worked solutions of labs/14_plan_a_run.ipynb (try the exercises first).
tests/test_exercises.py holds them to ckptlab's checkers."""

from ckptlab.cluster import step_memory as sm

GPT3 = sm.GPTShape(96, 12288, 96, 2048, 51200)  # vocabulary padded to 51,200 (Megatron)

# Exercise 1. 16 bytes a parameter (2 + 2 + 12), every one of them sharded over the 1024 GPUs:
# 16 * 174.6e9 / 1024 = 2.73e9 bytes, 2.5 GiB per GPU.
answer_1 = 16 * GPT3.params() / 1024

# Exercise 2. A tensor-parallel rank of t = 8 holds its share of the parameters, psi =
# GPT3.params(8); ZeRO stage 1 over d = 128 shards the 12 bytes of optimizer state (fp32 master
# copy, momentum, variance) and keeps the 16-bit weights and gradients whole:
# (2 + 2) psi + 12 psi / 128.
psi = GPT3.params(8)
answer_2 = 4 * psi + 12 * psi / 128

# Exercise 3. GPT-3 175B on 128 A100s with 40 GiB each, a global batch of 128 sequences.
# The model states first: 16 bytes a parameter, 2.8 TB, must be divided by t p (and 12 of the
# 16 by d too, with ZeRO-1). Tensor parallelism over the whole node, t = 8: its collectives stay
# on NVLink. Then the smallest pipeline whose first stage fits. That stage holds p micro-batches
# of L / p layers (1F1B), the whole model's activations for one micro-batch whatever p: about
# 96 x 34 s b h / t = 9.6 GiB with FlashAttention's recompute, micro-batch 1. Its states, with
# psi = 174.6e9 / (8 p) and d = 128 / (8 p):
#   p = 4, d = 4: psi = 5.46e9, (2 + 2 + 12 / 4) psi = 38.2e9 bytes = 35.6 GiB: with the
#                 activations 45 GiB, over 40: it fits only by recomputing layers whole;
#   p = 8, d = 2: psi = 2.73e9, (2 + 2 + 12 / 2) psi = 27.3e9 bytes = 25.4 GiB: 35 GiB, fits
#                 with nothing more recomputed than FlashAttention's scores.
# p = 16 fits too, but its stages are 6 layers, not 12: the head on the last stage (V / (12 h) =
# 0.35 of a layer's matmuls) weighs twice as much against them, and the bubble (p - 1) / (v m)
# grows. No pipeline (FSDP over d = 16) fits at micro-batch 1, where its all-gathers over
# InfiniBand cannot hide behind so short a forward and backward, and at micro-batch 4 only by
# recomputing most layers whole. So t = 8, p = 8 (d = 2).
answer_3 = (8, 8)
