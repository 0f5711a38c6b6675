"""Checkers of labs/12_take_it_to_pytorch.ipynb, one function per exercise.

The expected values come from ckptlab itself (a torch profile of the block, the schedules'
predictions, the at_scale formulas), never typed in. This module imports PyTorch only inside
the checker that runs a torch model, so that it loads without PyTorch.
"""

from __future__ import annotations

from ckptlab.cluster import at_scale
from ckptlab.exercises import lab10
from ckptlab.exercises.verdict import NOT_YET, Verdict, exact, unanswered, wrong


def mlp_block_saved_bytes(answer, B: int, D: int) -> Verdict:
    """Bytes one block of the torch MLP (ckptlab.torch.nets.MLPBlock: width D, hidden 4D,
    dropout 0.1) saves for its backward on a CPU, for B rows of fp32 input that want a
    gradient, as autograd's saved_tensors_hooks count it (by storage, parameters excluded)."""
    if unanswered(answer):
        return Verdict(NOT_YET)
    try:
        import torch

        from ckptlab.torch import nets, profile
    except ImportError as e:
        return wrong(f"this checker measures the block in PyTorch, which is missing ({e})")
    torch.manual_seed(0)
    x = torch.randn(B, D, requires_grad=True)
    want = sum(profile([nets.MLPBlock(D, 4 * D, 0.1)], x).stages[0].saved.values())
    f = 4  # bytes per fp32 value
    return exact(answer, want, "the byte count", hints=[
        (f * B * D + f * B * 4 * D + B * D,
         "on the CPU torch's dropout multiplies by a float noise tensor (1/(1-p) or 0) and "
         "keeps that, 4 bytes per element, not a 1-byte mask"),
        (f * B * D + 2 * f * B * 4 * D + f * B * D,
         "relu's output is saved by relu and by the second matmul: one storage, counted once"),
        (f * B * 4 * D + f * B * D,
         "the first matmul keeps its input x to compute the weight's gradient"),
    ], hint="list what each op needs for its backward: matmul its input, relu its output, "
            "dropout its mask")


def schedule_for_budget(answer, prof, fraction: float = 0.4) -> Verdict:
    """As in lab 10, on the torch GPT's profile: a schedule (spec, Schedule or plan; not
    optimal(...)) whose predicted peak fits `fraction` of the no-checkpointing peak and which
    recomputes fewer FLOPs than sqrt."""
    return lab10.schedule_for_budget(answer, prof, fraction)


def tp_bytes_per_gpu(answer, s: int, b: int, h: int, a: int, t: int) -> Verdict:
    """Bytes one transformer layer holds for its backward on each GPU of a tensor-parallel
    group of t, without sequence parallelism and without recompute (Korthikanti et al.,
    16-bit activations)."""
    want = at_scale.layer_activation_bytes(s, b, h, a, "none", t)
    return exact(answer, want, "the byte count", hints=[
        (at_scale.layer_activation_bytes(s, b, h, a, "none", t, sp=True),
         "that divides everything by t, the LayerNorm and block inputs and the dropout masks "
         "too: that is with sequence parallelism; tensor parallelism alone replicates them"),
        (at_scale.layer_activation_bytes(s, b, h, a, "none"),
         "that is one GPU without parallelism: t GPUs split Q, K, V, the attention core and "
         "the MLP's 4h activations"),
        (at_scale.layer_activation_bytes(s, b, h, a, "selective", t),
         "that leaves out the attention core's 5 a s^2 b / t bytes (softmax, dropout)"),
    ], hint="lab 11's count per GPU: which terms does tensor parallelism divide by t, and "
            "which does it leave whole on every GPU?")
