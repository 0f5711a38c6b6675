"""Every exercise checker (ckptlab.exercises.lab01 ... lab12) against the worked solution
(labs/solutions/, hand derivations independent of the models the checkers use): "right";
against a wrong answer: "wrong, because <a reason>"; against None and the `...` placeholder:
"not answered yet". A checker must never raise on an answer, whatever it is."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from ckptlab import device
from ckptlab.exercises import (
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
)
from ckptlab.measure import traffic

SOLUTIONS = Path(__file__).resolve().parent.parent / "labs" / "solutions"


def solution(name: str):
    """Load labs/solutions/<name>.py (file names start with digits: not importable by name)."""
    spec = importlib.util.spec_from_file_location(f"solution_{name}", SOLUTIONS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    with device.use("emu"):  # loaded at import, before conftest pins the target: a solution
        spec.loader.exec_module(module)  # that makes arrays makes them for the emulator
    return module


S1, S2 = solution("01_roofline"), solution("02_naive_attention")
S3, S4 = solution("03_store_p_backward"), solution("04_flash_forward")
S5, S6 = solution("05_recompute_backward"), solution("06_when_recompute_pays")
S7 = solution("07_dropout_and_determinism")
S8, S9 = solution("08_segment_checkpointing"), solution("09_schedules_and_budgets")
S10, S12 = solution("10_tensor_cores"), solution("12_at_scale")
with device.use("emu"):  # made at import, before conftest pins a target: on a GPU machine the
    # detected target would be "cuda"; the notebooks run on the emulator, so the profiles do too
    P8, P9 = S8.notebook_profile(), S9.notebook_profile()  # the chains the notebooks profile
GPT3 = dict(s=2048, b=1, h=12288, a=96)

# (checker, its keyword arguments as the notebook passes them, the solution's answer, a wrong
# answer). Where the solution is a formula, odd sizes are tried besides the notebook's.
CASES = [
    ("sgemm_bytes", lab01.sgemm_bytes, dict(M=40, N=24, K=56), S1.answer_1,
     4 * (40 * 56 + 56 * 24)),
    ("sgemm_bytes odd", lab01.sgemm_bytes, dict(M=17, N=33, K=5), S1.sgemm_bytes(17, 33, 5), 1),
    ("softmax_intensity", lab01.softmax_intensity, dict(R=4096, C=4096), S1.answer_2, 5 / 8),
    ("compute_bound_tile", lab01.compute_bound_tile, dict(device="A100", size=4096), S1.answer_3,
     16),
    ("free_flops", lab01.free_flops, dict(R=4096, C=4096, device="H100"), S1.answer_4, 20.0),
    ("race_fixed", lab01.race_fixed, {}, S1.answer_5, lab01.racy_sgemm_source()),
    ("sgemm_shared_bytes", lab01.sgemm_shared_bytes, dict(tile=32), S1.answer_6, 4096),
    ("naive_nn_bytes", lab02.naive_nn_bytes, dict(B=1, H=2, N=100, d=32), S2.answer_1,
     2 * 4 * 2 * 100 * 100),
    ("naive_nn_bytes odd", lab02.naive_nn_bytes, dict(B=3, H=1, N=37, d=16),
     S2.naive_nn_bytes(3, 1, 37, 16), 7),
    ("naive_saved_bytes", lab02.naive_saved_bytes, dict(B=64, H=16, N=1024, d=64), S2.answer_2,
     2 * S2.answer_2),
    ("traffic_exponent", lab02.traffic_exponent, dict(d=64), S2.answer_3, 1),
    ("softmax_backward", lab03.softmax_backward, {}, S3.softmax_backward, lambda P, dP: P * dP),
    ("store_p_reads", lab03.store_p_reads, dict(B=1, H=2, N=100, d=32), S3.answer_2,
     4 * 2 * 100 * 100),
    ("store_p_reads odd", lab03.store_p_reads, dict(B=2, H=3, N=45, d=128),
     S3.store_p_reads(2, 3, 45, 128), 3),
    ("online_merge", lab04.online_merge, {}, S4.merge,
     lambda m_a, l_a, m_b, l_b: (np.maximum(m_a, m_b), l_a + l_b)),
    ("flash_tile_rows", lab04.flash_tile_rows, dict(d=128, Bc=16), S4.answer_2, 64),
    ("flash_tile_rows d=64", lab04.flash_tile_rows, dict(d=64, Bc=32),
     S4.flash_tile_rows(64, 32), 8),
    ("flash_saved_bytes", lab04.flash_saved_bytes, dict(B=64, H=16, N=1024, d=64), S4.answer_3,
     4 * 64 * 16 * 1024 * 64),
    ("recompute_flops", lab05.recompute_flops, dict(B=1, H=2, N=100, d=32), S5.answer_1,
     S5.answer_1 // 2),
    ("recompute_bytes_saved", lab05.recompute_bytes_saved, dict(B=1, H=1, N=300, d=64),
     S5.answer_2, S5.answer_2 // 2),
    ("recompute_bytes_saved odd", lab05.recompute_bytes_saved, dict(B=2, H=3, N=37, d=40),
     S5.recompute_bytes_saved(2, 3, 37, 40), 3),
    ("crossing_d", lab06.crossing_d, dict(gpu="A100", dtype="bf16"), S6.answer_1, 32),
    ("hfu_over_mfu", lab06.hfu_over_mfu, dict(B=64, H=16, N=1024, d=64), S6.answer_2, 10 / 8),
    ("mask_bytes", lab07.mask_bytes, dict(B=64, H=16, N=1024), S7.answer_1, 4 * S7.answer_1),
    ("deterministic_flops_ratio", lab07.deterministic_flops_ratio,
     dict(B=64, H=16, N=1024, d=64), S7.answer_2, 1.0),
    ("least_memory_segments", lab08.least_memory_segments, dict(prof=P8), S8.answer_1, 6),
    ("checkpoint_flops_ratio", lab08.checkpoint_flops_ratio, dict(prof=P8), S8.answer_2, 2.0),
    ("schedule_for_budget", lab09.schedule_for_budget, dict(prof=P9, fraction=0.4),
     S9.answer_1, "sqrt"),
    ("revolve_one_snapshot", lab09.revolve_one_snapshot, dict(l=10), S9.answer_2, 100),
    ("korthikanti_bytes", lab12.korthikanti_bytes, GPT3, S12.answer_1, 34 * 2048 * 12288),
    ("selective_saving", lab12.selective_saving, GPT3, S12.answer_2, 100 * S12.answer_2),
    ("zero3_state_bytes", lab12.zero3_state_bytes, dict(params=174_615_846_912, gpus=1024),
     S12.answer_3, 16 * 174_615_846_912),
    ("wmma_gemm_bytes", lab10.wmma_gemm_bytes, dict(M=100, N=40, K=56), S10.answer_1,
     S10.answer_1 // 2),
    ("wmma_gemm_bytes odd", lab10.wmma_gemm_bytes, dict(M=17, N=33, K=5),
     S10.wmma_gemm_bytes(17, 33, 5), 4 * (17 * 5 + 5 * 33) + 4 * 17 * 33),
    ("bf16_bytes_ratio", lab10.bf16_bytes_ratio, dict(B=1, H=1, N=1024, d=64), S10.answer_2,
     0.5),
    ("flash_intensity", lab10.flash_intensity, dict(B=1, H=1, N=1024, d=64), S10.answer_3,
     S10.answer_3 / 2),
]

# Lab 11 (PyTorch): the checker of exercise 1 runs a torch block and exercise 2 plans the
# notebook's torch GPT, so those two need PyTorch; exercise 3 is a formula.
S11 = solution("11_take_it_to_pytorch")
try:
    import torch  # noqa: F401
    NO_TORCH = None
except ImportError as e:
    NO_TORCH = f"lab 11's checkers run PyTorch, which is not installed ({e})"
CASES += [
    ("tp_bytes_per_gpu", lab11.tp_bytes_per_gpu, dict(**GPT3, t=8), S11.answer_3,
     2048 * 12288 * 114 // 8),
    ("tp_bytes_per_gpu odd", lab11.tp_bytes_per_gpu, dict(s=100, b=3, h=48, a=6, t=3),
     100 * 3 * 48 * (10 + 24 // 3) + 5 * 6 * 100 * 100 * 3 // 3, 100 * 3 * 48 * 34 // 3),
]
if NO_TORCH is None:
    CASES += [
        ("mlp_block_saved_bytes", lab11.mlp_block_saved_bytes, dict(B=32, D=64), S11.answer_1,
         S11.answer_1 - 3 * 32 * 64),
        ("mlp_block_saved_bytes odd", lab11.mlp_block_saved_bytes, dict(B=7, D=16),
         24 * 7 * 16, 20 * 7 * 16),
        ("schedule_for_budget torch", lab11.schedule_for_budget,
         dict(prof=S11.notebook_profile(), fraction=0.4), S11.answer_2, "sqrt"),
    ]
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("name, checker, kwargs, right, wrong", CASES, ids=IDS)
def test_solution_is_right(name, checker, kwargs, right, wrong):
    assert checker(right, **kwargs) == "right"


@pytest.mark.parametrize("name, checker, kwargs, right, wrong", CASES, ids=IDS)
def test_wrong_answer_says_why(name, checker, kwargs, right, wrong):
    verdict = checker(wrong, **kwargs)
    assert verdict.startswith("wrong, because ")
    assert len(verdict) > len("wrong, because ") + 20, verdict  # a reason, not a bare "wrong"


@pytest.mark.parametrize("name, checker, kwargs, right, wrong", CASES, ids=IDS)
@pytest.mark.parametrize("unanswered", [None, ...], ids=["None", "Ellipsis"])
def test_unanswered(name, checker, kwargs, right, wrong, unanswered):
    assert checker(unanswered, **kwargs) == "not answered yet"


@pytest.mark.parametrize("name, checker, kwargs, right, wrong", CASES, ids=IDS)
@pytest.mark.parametrize("odd", ["1e3", [1, 2], True, float("nan"), object()])
def test_odd_answers_are_wrong_not_errors(name, checker, kwargs, right, wrong, odd):
    verdict = checker(odd, **kwargs)
    assert verdict.startswith("wrong, because "), verdict


def placeholder(*args):
    return ...  # what the notebook ships: a function whose body is still `...`


def broken(*args):
    raise ZeroDivisionError("oops")


@pytest.mark.parametrize("checker", [lab03.softmax_backward, lab04.online_merge])
def test_function_exercises(checker):
    assert checker(placeholder) == "not answered yet"
    assert checker(broken) == "wrong, because your function raised ZeroDivisionError: oops"
    assert checker(lambda *a: np.zeros(3)).startswith("wrong, because ")


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # a slip's own
def test_the_usual_slips_get_their_own_reason():
    assert "ceil(N/16)" in lab01.sgemm_bytes(4 * (40 * 56 + 56 * 24 + 40 * 24), 40, 24, 56)
    assert "elements" in lab01.sgemm_bytes(S1.answer_1 / 4, 40, 24, 56)
    assert "reads x twice" in lab01.softmax_intensity(5 / 8, 4096, 4096)
    assert "below the ridge" in lab01.compute_bound_tile(38)
    assert "smallest" in lab01.compute_bound_tile(64)
    assert "sum to 0" in lab03.softmax_backward(lambda P, dP: P * dP)
    dS = lab03.softmax_backward(lambda P, dP: dP - (P * dP).sum(axis=1, keepdims=True))
    assert "factor P_ij" in dS
    unshifted = lab04.online_merge(lambda m_a, l_a, m_b, l_b: (
        np.zeros_like(m_a), l_a * np.exp(m_a) + l_b * np.exp(m_b)))
    assert "not finite" in unshifted
    one_sided = lab04.online_merge(lambda m_a, l_a, m_b, l_b: (m_b, l_a * np.exp(m_a - m_b) + l_b))
    assert "not the row max" in one_sided
    assert "larger multiple" in lab04.flash_tile_rows(48)
    assert "over the" in lab04.flash_tile_rows(64)
    assert "multiple of 8" in lab04.flash_tile_rows(50)
    assert "L = m + log l" in lab04.flash_saved_bytes(4 * 64 * 16 * 1024 * 64, 64, 16, 1024, 64)
    naive_minus_flash = (traffic.totals(traffic.launches("naive", 1, 1, 256, 256, 64))["bytes"]
                         - traffic.totals(traffic.launches("flash", 1, 1, 256, 256, 64))["bytes"])
    assert "fusion and recompute together" in lab05.recompute_bytes_saved(
        naive_minus_flash, 1, 1, 256, 64)
    assert "the fp32 crossing" in lab06.crossing_d(16, "A100", "bf16")  # fp32: at every d
    assert "still pays" in lab06.crossing_d(32, "A100", "bf16")
    assert "still pays" in lab06.crossing_d(64, "A100", "bf16")  # 1.46: S in fp32 costs 8 B
    assert "first d" in lab06.crossing_d(32, "A100", "fp32")  # fp32 crosses at 16
    assert "does fall below 1" in lab06.crossing_d("never", "A100", "bf16")
    assert "fp32 SGEMM" in lab10.wmma_gemm_bytes(4 * (100 * 56 * 3 + 56 * 40 * 7) + 4 * 4000,
                                                 100, 40, 56)
    assert "L and D" in lab10.bf16_bytes_ratio(0.5)
    assert "hardware FLOPs" in lab10.flash_intensity(S10.answer_3 * 12 / 18)


def test_schedule_answers_in_every_form():
    from ckptlab.recompute import schedules
    from ckptlab.recompute.checkpoint import Seg

    budget = dict(prof=P9, fraction=0.4)
    assert lab09.schedule_for_budget(schedules.Schedule("mine", S9.answer_1), **budget) == "right"
    assert "DP's own answer" in lab09.schedule_for_budget("optimal(40%)", **budget)
    assert "over the budget" in lab09.schedule_for_budget("selective(matmul)", **budget)
    assert "over the budget" in lab09.schedule_for_budget("keep(matmul)", **budget)
    assert "over the budget" in lab09.schedule_for_budget("recompute(attn)", **budget)
    assert "no fewer than sqrt" in lab09.schedule_for_budget("every(2)", **budget)
    assert "cannot be built" in lab09.schedule_for_budget("every(two)", **budget)
    assert "cannot be" in lab09.schedule_for_budget([Seg([0, 1]), 3], **budget)  # not a cover
    assert "more segments" in lab08.least_memory_segments(2, P8)
    assert "fewer segments" in lab08.least_memory_segments(32, P8)
    assert "whole number" in lab08.least_memory_segments(0, P8)


def test_verdict_displays_bare():
    v = lab01.sgemm_bytes(S1.answer_1, 40, 24, 56)
    assert repr(v) == "right" and isinstance(v, str)


@pytest.mark.skipif(NO_TORCH is None, reason="PyTorch is installed: lab 11's cases run above")
def test_lab10_cases_that_need_pytorch():
    pytest.skip(NO_TORCH)


def test_lab10_usual_slips():
    assert "sequence parallelism" in lab11.tp_bytes_per_gpu(2048 * 12288 * 114 // 8, **GPT3, t=8)
    assert "without parallelism" in lab11.tp_bytes_per_gpu(2048 * 12288 * 114, **GPT3, t=8)
    if NO_TORCH is None:
        assert "float noise" in lab11.mlp_block_saved_bytes(21 * 32 * 64, B=32, D=64)
        assert "counted once" in lab11.mlp_block_saved_bytes(40 * 32 * 64, B=32, D=64)
