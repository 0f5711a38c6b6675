"""Checkers of labs/14_plan_a_run.ipynb (a whole training step's memory per GPU, and a plan
for a run), one function per exercise: zero3_state_bytes (1), zero1_state_bytes (2) and
choose_layout (3, "choose t and p for a given model and cluster": ckptlab.exercises.plan_layout).

The expected values come from ckptlab itself (the step model in ckptlab.cluster.step_memory,
the planner in ckptlab.cluster.planner), never typed in.
"""

from __future__ import annotations

from ckptlab.cluster import step_memory as sm
from ckptlab.exercises.plan_layout import choose_layout
from ckptlab.exercises.verdict import Verdict, close

__all__ = ["choose_layout", "zero1_state_bytes", "zero3_state_bytes"]


def zero3_state_bytes(answer, params: int, gpus: int) -> Verdict:
    """Bytes of model states (16-bit weights and gradients, fp32 master weights and Adam
    moments: ZeRO's 16 bytes a parameter) each of `gpus` GPUs holds under ZeRO-3 / FSDP."""
    want = sum(sm.model_states(params, "bf16", gpus, 3).values())
    return close(answer, want, "the bytes per GPU", 0.001, hints=[
        (16 * params, "that is the whole model's states: ZeRO-3 splits them over the GPUs"),
        (2 * params / gpus, "that is the 16-bit weights only: count the gradients (2 bytes), "
                            "the fp32 master copy, momentum and variance (12) too"),
    ], hint="(2 + 2 + 12) bytes a parameter, divided over the GPUs")


def zero1_state_bytes(answer, params: int, tp: int, dp: int) -> Verdict:
    """Bytes of model states each GPU holds with tensor parallelism over tp GPUs (each rank
    holds `params` / tp of the parameters: params is the rank's own count here) and ZeRO
    stage 1 over dp data-parallel ranks: 16-bit weights and gradients whole, the fp32 master
    copy and Adam's moments sharded."""
    want = sum(sm.model_states(params, "bf16", dp, 1).values())
    return close(answer, want, "the bytes per GPU", 0.001, hints=[
        (16 * params / dp, "stage 1 shards only the optimizer state (master copy, momentum, "
                           "variance); the weights and gradients stay whole on every rank"),
        (16 * params, "stage 1 shards the optimizer state over the data-parallel ranks"),
        (16 * params * tp, "the parameter count given is already one tensor-parallel rank's"),
    ], hint="which of the 16 bytes a parameter does stage 1 divide, and by what?")
