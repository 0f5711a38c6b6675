"""Every exercise checker (ckptlab.exercises.lab01 ... lab14, appendix_a1) against the worked
solution (labs/solutions/, hand derivations independent of the models the checkers use; the
cases are tests/exercise_cases.py): "right";
against a wrong answer: "wrong, because <a reason>"; against None and the `...` placeholder:
"not answered yet". A checker must never raise on an answer, whatever it is."""

import numpy as np
import pytest
from exercise_cases import CASES, GPT3, NO_TORCH, P9, P10, S1, S8, S10

from ckptlab.exercises import lab01, lab03, lab04, lab05, lab07, lab08, lab09, lab10, lab12
from ckptlab.measure import traffic

IDS = [c.id for c in CASES]
ROWS = [(c.id, c.checker, c.kwargs, c.right, c.wrong) for c in CASES]


@pytest.mark.parametrize("name, checker, kwargs, right, wrong", ROWS, ids=IDS)
def test_solution_is_right(name, checker, kwargs, right, wrong):
    assert checker(right, **kwargs) == "right"


@pytest.mark.parametrize("name, checker, kwargs, right, wrong", ROWS, ids=IDS)
def test_wrong_answer_says_why(name, checker, kwargs, right, wrong):
    verdict = checker(wrong, **kwargs)
    assert verdict.startswith("wrong, because ")
    assert len(verdict) > len("wrong, because ") + 20, verdict  # a reason, not a bare "wrong"


@pytest.mark.parametrize("name, checker, kwargs, right, wrong", ROWS, ids=IDS)
@pytest.mark.parametrize("unanswered", [None, ...], ids=["None", "Ellipsis"])
def test_unanswered(name, checker, kwargs, right, wrong, unanswered):
    assert checker(unanswered, **kwargs) == "not answered yet"


@pytest.mark.parametrize("name, checker, kwargs, right, wrong", ROWS, ids=IDS)
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
    assert "once each" in lab01.sgemm_bytes(4 * (40 * 56 + 56 * 24 + 40 * 24), 40, 24, 56)
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
    assert "the fp32 crossing" in lab08.crossing_d(32, "A100", "bf16")  # fp32: at every d
    assert "still pays" in lab08.crossing_d(64, "A100", "bf16")  # 1.46: S in fp32 costs 8 B
    assert "still pays" in lab08.crossing_d(96, "A100", "bf16")  # 1.07: 4 R / 7 = 87 misleads
    assert "first d" in lab08.crossing_d(64, "A100", "fp32")  # fp32 crosses at 32
    assert "the sweep has d in" in lab08.crossing_d(16, "A100", "bf16")
    assert "does fall below 1" in lab08.crossing_d("never", "A100", "bf16")
    assert "fp32 SGEMM" in lab07.wmma_gemm_bytes(4 * (100 * 56 * 3 + 56 * 40 * 7) + 4 * 4000,
                                                 100, 40, 56)
    assert "L and D" in lab07.bf16_bytes_ratio(0.5)
    assert "hardware FLOPs" in lab08.flash_intensity(S8.answer_2 * 12 / 18)


def test_schedule_answers_in_every_form():
    from ckptlab.recompute import schedules
    from ckptlab.recompute.checkpoint import Seg

    budget = dict(prof=P10, fraction=0.4)
    assert lab10.schedule_for_budget(schedules.Schedule("mine", S10.answer_1), **budget) == "right"
    assert "DP's own answer" in lab10.schedule_for_budget("optimal(40%)", **budget)
    assert "over the budget" in lab10.schedule_for_budget("selective(matmul)", **budget)
    assert "over the budget" in lab10.schedule_for_budget("keep(matmul)", **budget)
    assert "over the budget" in lab10.schedule_for_budget("recompute(attn)", **budget)
    assert "no fewer than sqrt" in lab10.schedule_for_budget("every(2)", **budget)
    assert "cannot be built" in lab10.schedule_for_budget("every(two)", **budget)
    assert "cannot be" in lab10.schedule_for_budget([Seg([0, 1]), 3], **budget)  # not a cover
    assert "more segments" in lab09.least_memory_segments(2, P9)
    assert "fewer segments" in lab09.least_memory_segments(32, P9)
    assert "whole number" in lab09.least_memory_segments(0, P9)


def test_verdict_displays_bare():
    v = lab01.sgemm_bytes(S1.answer_1, 40, 24, 56)
    assert repr(v) == "right" and isinstance(v, str)


@pytest.mark.skipif(NO_TORCH is None, reason="PyTorch is installed: lab 12's cases run above")
def test_lab12_cases_that_need_pytorch():
    pytest.skip(NO_TORCH)


def test_lab12_usual_slips():
    assert "sequence parallelism" in lab12.tp_bytes_per_gpu(2048 * 12288 * 114 // 8, **GPT3, t=8)
    assert "without parallelism" in lab12.tp_bytes_per_gpu(2048 * 12288 * 114, **GPT3, t=8)
    if NO_TORCH is None:
        assert "float noise" in lab12.mlp_block_saved_bytes(21 * 32 * 64, B=32, D=64)
        assert "counted once" in lab12.mlp_block_saved_bytes(40 * 32 * 64, B=32, D=64)
