"""Every exercise of the labs as a case: its notebook, its checker and the keyword arguments the
notebook passes, the worked solution's answer (labs/solutions/, hand derivations independent of
the models the checkers use) and a wrong answer. tests/test_exercises.py holds each checker to
its cases; tests/test_no_answer_given_away.py looks for each right answer where a learner would
see it before answering. Not a test file: imported by both."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ckptlab import device
from ckptlab.cli.plan import MODELS
from ckptlab.exercises import (
    appendix_a1,
    lab01,
    lab02,
    lab03,
    lab04,
    lab05,
    lab06,
    lab07,
    lab08,
    lab09,
    lab10,
    lab11,
    lab12,
    lab13,
    lab14,
)

SOLUTIONS = Path(__file__).resolve().parent.parent / "labs" / "solutions"


def solution(name: str):
    """Load labs/solutions/<name>.py (file names start with digits: not importable by name)."""
    spec = importlib.util.spec_from_file_location(f"solution_{name}", SOLUTIONS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    with device.use("emu"):  # loaded at import, before conftest pins the target: a solution
        spec.loader.exec_module(module)  # that makes arrays makes them for the emulator
    return module


@dataclass
class Case:
    lab: str  # the notebook's tag: "01" ... "14", "A1"
    exercise: int | None  # its number in the notebook; None: an extra case at other sizes
    checker: object
    kwargs: dict
    right: object
    wrong: object
    id: str = field(default="")

    def __post_init__(self):
        self.id = self.id or self.checker.__name__


S1, S2 = solution("01_roofline"), solution("02_naive_attention")
S3, S4 = solution("03_store_p_backward"), solution("04_flash_forward")
S5, S6 = solution("05_recompute_backward"), solution("06_dropout_and_determinism")
S7, S8 = solution("07_tensor_cores"), solution("08_when_recompute_pays")
S9, S10 = solution("09_segment_checkpointing"), solution("10_schedules_and_budgets")
S11, S12 = solution("11_activations_at_scale"), solution("12_take_it_to_pytorch")
S13, S14 = solution("13_offload_or_recompute"), solution("14_plan_a_run")
SA1 = solution("A1_hfu_mfu_and_fig2")
with device.use("emu"):  # made at import, before conftest pins a target: on a GPU machine the
    # detected target would be "cuda"; the notebooks run on the emulator, so the profiles do too
    P9, P10 = S9.notebook_profile(), S10.notebook_profile()  # the chains the notebooks profile
GPT3 = dict(s=2048, b=1, h=12288, a=96)
# Lab 14's exercise 3: GPT-3 175B on 128 A100s with 40 GiB each, a batch of 128 sequences
CLUSTER14 = dict(model=MODELS["gpt3-175b"], gpus=128, gpu="a100", memory_gib=40, batch=128)

CASES = [
    Case("01", 1, lab01.sgemm_bytes, dict(M=40, N=24, K=56), S1.answer_1,
         4 * (40 * 56 + 56 * 24)),
    Case("01", None, lab01.sgemm_bytes, dict(M=17, N=33, K=5), S1.sgemm_bytes(17, 33, 5), 1,
         "sgemm_bytes odd"),
    Case("01", 2, lab01.softmax_intensity, dict(R=4096, C=4096), S1.answer_2, 5 / 8),
    Case("01", 3, lab01.compute_bound_tile, dict(device="A100", size=4096), S1.answer_3, 16),
    Case("01", 4, lab01.free_flops, dict(R=4096, C=4096, device="H100"), S1.answer_4, 20.0),
    Case("01", 5, lab01.race_fixed, {}, S1.answer_5, lab01.racy_sgemm_source()),
    Case("01", 6, lab01.sgemm_shared_bytes, dict(tile=32), S1.answer_6, 4096),
    Case("02", 1, lab02.naive_nn_bytes, dict(B=1, H=2, N=100, d=32), S2.answer_1,
         2 * 4 * 2 * 100 * 100),
    Case("02", None, lab02.naive_nn_bytes, dict(B=3, H=1, N=37, d=16),
         S2.naive_nn_bytes(3, 1, 37, 16), 7, "naive_nn_bytes odd"),
    Case("02", 2, lab02.naive_saved_bytes, dict(B=64, H=16, N=1024, d=64), S2.answer_2,
         2 * S2.answer_2),
    Case("02", 3, lab02.traffic_exponent, dict(d=64), S2.answer_3, 1),
    Case("03", 1, lab03.softmax_backward, {}, S3.softmax_backward, lambda P, dP: P * dP),
    Case("03", 2, lab03.store_p_reads, dict(B=1, H=2, N=100, d=32), S3.answer_2,
         4 * 2 * 100 * 100),
    Case("03", None, lab03.store_p_reads, dict(B=2, H=3, N=45, d=128),
         S3.store_p_reads(2, 3, 45, 128), 3, "store_p_reads odd"),
    Case("04", 1, lab04.online_merge, {}, S4.merge,
         lambda m_a, l_a, m_b, l_b: (np.maximum(m_a, m_b), l_a + l_b)),
    Case("04", 2, lab04.flash_tile_rows, dict(d=128, Bc=16), S4.answer_2, 64),
    Case("04", None, lab04.flash_tile_rows, dict(d=64, Bc=32), S4.flash_tile_rows(64, 32), 8,
         "flash_tile_rows d=64"),
    Case("04", 3, lab04.flash_saved_bytes, dict(B=64, H=16, N=1024, d=64), S4.answer_3,
         4 * 64 * 16 * 1024 * 64),
    Case("05", 1, lab05.recompute_flops, dict(B=1, H=2, N=100, d=32), S5.answer_1,
         S5.answer_1 // 2),
    Case("05", 2, lab05.recompute_bytes_saved, dict(B=1, H=1, N=300, d=64), S5.answer_2,
         S5.answer_2 // 2),
    Case("05", None, lab05.recompute_bytes_saved, dict(B=2, H=3, N=37, d=40),
         S5.recompute_bytes_saved(2, 3, 37, 40), 3, "recompute_bytes_saved odd"),
    Case("06", 1, lab06.mask_bytes, dict(B=64, H=16, N=1024), S6.answer_1, 4 * S6.answer_1),
    Case("06", 2, lab06.deterministic_flops_ratio, dict(B=64, H=16, N=1024, d=64), S6.answer_2,
         1.0),
    Case("07", 1, lab07.wmma_gemm_bytes, dict(M=100, N=40, K=56), S7.answer_1,
         S7.answer_1 // 2),
    Case("07", None, lab07.wmma_gemm_bytes, dict(M=17, N=33, K=5), S7.wmma_gemm_bytes(17, 33, 5),
         4 * (17 * 5 + 5 * 33) + 4 * 17 * 33, "wmma_gemm_bytes odd"),
    Case("07", 2, lab07.bf16_bytes_ratio, dict(B=1, H=1, N=1024, d=64), S7.answer_2, 0.5),
    Case("08", 1, lab08.crossing_d, dict(gpu="A100", dtype="bf16"), S8.answer_1, 32),
    Case("08", 2, lab08.flash_intensity, dict(B=1, H=1, N=1024, d=64), S8.answer_2,
         S8.answer_2 / 2),
    Case("09", 1, lab09.least_memory_segments, dict(prof=P9), S9.answer_1, 6),
    Case("09", 2, lab09.checkpoint_flops_ratio, dict(prof=P9), S9.answer_2, 2.0),
    Case("10", 1, lab10.schedule_for_budget, dict(prof=P10, fraction=0.4), S10.answer_1, "sqrt"),
    Case("10", 2, lab10.revolve_one_snapshot, dict(l=10), S10.answer_2, 100),
    Case("11", 1, lab11.korthikanti_bytes, GPT3, S11.answer_1, 34 * 2048 * 12288),
    Case("11", 2, lab11.selective_saving, GPT3, S11.answer_2, 100 * S11.answer_2),
    Case("11", 3, lab11.llama_layer_bytes,
         dict(s=8192, b=1, h=4096, a=32, kv=8, ffn=14336), S11.answer_3, 34 * 8192 * 4096),
    Case("12", 3, lab12.tp_bytes_per_gpu, dict(**GPT3, t=8), S12.answer_3,
         2048 * 12288 * 114 // 8),
    Case("12", None, lab12.tp_bytes_per_gpu, dict(s=100, b=3, h=48, a=6, t=3),
         100 * 3 * 48 * (10 + 24 // 3) + 5 * 6 * 100 * 100 * 3 // 3, 100 * 3 * 48 * 34 // 3,
         "tp_bytes_per_gpu odd"),
    Case("13", 1, lab13.copy_ms, dict(link="PCIe 5.0 x16", **GPT3), S13.answer_1,
         2 * S13.answer_1),
    Case("13", 2, lab13.break_even_gbps, dict(**GPT3, device="H100"), S13.answer_2,
         S13.answer_2 / 2),
    Case("14", 1, lab14.zero3_state_bytes, dict(params=S14.GPT3.params(), gpus=1024),
         S14.answer_1, 16 * S14.GPT3.params()),
    Case("14", 2, lab14.zero1_state_bytes, dict(params=S14.GPT3.params(8), tp=8, dp=128),
         S14.answer_2, 16 * S14.GPT3.params(8) / 128),
    Case("14", 3, lab14.choose_layout, CLUSTER14, S14.answer_3, (8, 4)),
    # the same cluster with 80 GiB a GPU: FSDP, no pipeline, ties within the model's error
    Case("14", None, lab14.choose_layout, dict(CLUSTER14, memory_gib=80), (4, 1), (8, 8),
         "choose_layout 80 GiB"),
    Case("A1", 1, appendix_a1.hfu_over_mfu, dict(B=64, H=16, N=1024, d=64), SA1.answer_1, 10 / 8),
    Case("A1", 2, appendix_a1.fig2_model_gflops, dict(B=64, H=16, N=1024, d=64), SA1.answer_2,
         66.6),
]

# Lab 12 (PyTorch): the checker of exercise 1 runs a torch block and exercise 2 plans the
# notebook's torch GPT, so those two need PyTorch; exercise 3 is a formula (above).
try:
    import torch  # noqa: F401
    NO_TORCH = None
except ImportError as e:
    NO_TORCH = f"lab 12's checkers run PyTorch, which is not installed ({e})"
if NO_TORCH is None:
    CASES += [
        Case("12", 1, lab12.mlp_block_saved_bytes, dict(B=32, D=64), S12.answer_1,
             S12.answer_1 - 3 * 32 * 64),
        Case("12", None, lab12.mlp_block_saved_bytes, dict(B=7, D=16), 24 * 7 * 16, 20 * 7 * 16,
             "mlp_block_saved_bytes odd"),
        Case("12", 2, lab12.schedule_for_budget, dict(prof=S12.notebook_profile(), fraction=0.4),
             S12.answer_2, "sqrt", "schedule_for_budget torch"),
    ]
