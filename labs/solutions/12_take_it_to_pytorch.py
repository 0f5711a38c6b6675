"""Worked solutions of labs/12_take_it_to_pytorch.ipynb (try the exercises first).
tests/test_exercises.py holds them to ckptlab's checkers, on the notebook's own model."""

from ckptlab.recompute.checkpoint import Seg

B, D = 32, 64  # the MLP block of exercise 1


def notebook_profile():
    """The torch GPT the notebook profiles (6 blocks, ckptlab flash attention)."""
    import torch

    from ckptlab.torch import nets

    model = nets.GPT(vocab=64, ctx=32, width=32, heads=2, layers=6, attn="flash", seed=0)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 64, (2, 32), generator=gen)
    y = torch.randint(0, 64, (2, 32), generator=gen)
    return model.profile(x, y)


# Exercise 1. What each op keeps for its backward, on the CPU (by storage, parameters not
# counted): the first addmm its input x (B, D); relu its output (B, 4D), which the second addmm
# keeps too (one storage); dropout, which on the CPU multiplies by a float noise tensor, that
# noise (B, D) in fp32. 4 B D + 16 B D + 4 B D = 24 B D = 49,152 bytes for B = 32, D = 64.
answer_1 = 4 * B * D + 4 * B * 4 * D + 4 * B * D

# Exercise 2. As in lab 10: the last blocks are freed first in the backward, so keep them plain
# and checkpoint the first ones in pairs. Blocks 4 and 5 plain, 0-3 in two segments: the peak
# is the three held inputs plus two blocks' activations, and 4 of the 6 blocks are recomputed
# (sqrt recomputes all 6).
answer_2 = [Seg([0, 1]), Seg([2, 3]), 4, 5]

# Exercise 3. s b h (10 + 24/t + 5 a s / (h t)) with s = 2048, b = 1, h = 12288, a = 96, t = 8:
# 5 a s / h = 80, so 10 + 3 + 10 = 23: 2048 * 12288 * 23 = 578,813,952 bytes (0.54 GiB) per GPU
# and layer, against 114 s b h = 2.7 GiB on one GPU.
answer_3 = 2048 * 1 * 12288 * 23
