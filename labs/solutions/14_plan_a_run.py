"""Worked solutions of labs/14_plan_a_run.ipynb (try the exercises first).
tests/test_exercises.py holds them to ckptlab's checkers."""

from ckptlab.measure import step_memory as sm

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
