"""Checkers that used to accept wrong answers, or blame the wrong thing: each wrong answer is
now wrong, for its own reason."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from ckptlab import device
from ckptlab.exercises import lab01, lab03, lab04, lab05, lab09
from ckptlab.measure import traffic

SOLUTIONS = Path(__file__).resolve().parent.parent / "labs" / "solutions"


def solution(name: str):
    spec = importlib.util.spec_from_file_location(f"slips_{name}", SOLUTIONS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    with device.use("emu"):  # loaded at import, before conftest pins the target: a solution
        spec.loader.exec_module(module)  # that makes arrays makes them for the emulator
    return module


S1, S4 = solution("01_roofline"), solution("04_flash_forward")
with device.use("emu"):  # the notebook profiles its chain on the emulator
    P9 = solution("09_segment_checkpointing").notebook_profile()


def test_merge_of_two_empty_parts_must_not_be_nan():
    """The textbook merge, without the guard, returns NaN for a fully masked row: wrong."""
    def unguarded(m_a, l_a, m_b, l_b):
        m = np.maximum(m_a, m_b)
        return m, l_a * np.exp(m_a - m) + l_b * np.exp(m_b - m)

    with np.errstate(invalid="ignore"):
        verdict = lab04.online_merge(unguarded)
    assert verdict.startswith("wrong, because two empty parts"), verdict
    assert "NaN" in verdict
    assert lab04.online_merge(S4.merge) == "right"

    def empty_made_zero(m_a, l_a, m_b, l_b):  # no NaN, but m = 0: not the empty state
        m, l = S4.merge(m_a, l_a, m_b, l_b)
        return np.where(np.isfinite(m), m, 0.0), l

    assert "empty state" in lab04.online_merge(empty_made_zero)


def test_merge_accepts_any_pair_and_names_what_came():
    """Right math returned as a list [m, l] is right; a triple is wrong and says so."""
    assert lab04.online_merge(lambda *a: list(S4.merge(*a))) == "right"
    verdict = lab04.online_merge(lambda *a: (*S4.merge(*a), 0))
    assert verdict.startswith("wrong") and "tuple of 3" in verdict, verdict
    assert "ndarray" in lab04.online_merge(lambda *a: np.stack(S4.merge(*a)))


def test_least_memory_segments_gives_the_distance_never_the_optimum():
    """Within 10% of the least peak is still wrong; the message says how far above the least and
    in which direction to look, and names neither the best k nor its bytes (it once did)."""
    peaks = {k: lab09.schedules.uniform(32, k).predict(P9).peak_bytes for k in range(1, 33)}
    best = min(peaks, key=peaks.get)
    assert lab09.least_memory_segments(best, P9) == "right"
    for k in (10, 13, 17):  # within 10% of the least: once accepted, now wrong
        assert peaks[k] <= 1.10 * peaks[best] and peaks[k] > peaks[best]
        verdict = lab09.least_memory_segments(k, P9)
        assert verdict.startswith("wrong, because "), verdict
        assert f"{peaks[k] / peaks[best] - 1:.1%} above the least" in verdict
        assert f"k = {best}" not in verdict and f"{peaks[best]:,}" not in verdict, verdict
        assert ("more segments" if k < best else "fewer segments") in verdict


def test_softmax_intensity_blames_the_flops_not_the_bytes():
    """5 FLOPs per element per pass (what the kernel's header used to suggest) gives 10/12."""
    t = traffic.softmax_rows(4096, 4096)
    assert t.flops == 5 * 4096 * 4096  # the model: 5 per element in all
    verdict = lab01.softmax_intensity(10 / 12, R=4096, C=4096)
    assert "bytes are right" in verdict and "not per pass" in verdict, verdict
    from ckptlab import device

    header = device.kernel_source("softmax_rows.cu").split("#include")[0]
    assert "5 per element in all" in header and "per pass" not in header


def test_the_race_exercise_reports_the_line_and_needs_the_tiles():
    racy = lab01.racy_sgemm_source()
    assert racy.count("__syncthreads()") == 1
    verdict = lab01.race_fixed(racy.replace("// (a barrier was here)", ""))
    assert "shared-memory race" in verdict and "<string>:" in verdict, verdict
    assert lab01.race_fixed(S1.answer_5) == "right"
    # a "fix" that drops the shared-memory tiles: right C, race-free, but not the tiled bytes
    untiled = racy.replace("As[tr][k] * Bs[k][tc]",
                           "(row < M && k0 + k < K && col < N ? A[row * K + k0 + k] * "
                           "B[(k0 + k) * N + col] : 0.0f)")
    verdict = lab01.race_fixed(untiled)
    assert "bytes" in verdict and "tiled kernel" in verdict, verdict
    assert "did not build" in lab01.race_fixed("this is not CUDA")


def test_tile_exercise_without_a_compiler_degrades(monkeypatch):
    from ckptlab.kernels import nvrtc

    def missing(*a, **k):
        raise nvrtc.CompilerNotFound("no NVRTC here: " + nvrtc.INSTALL_HINT)

    monkeypatch.setattr(nvrtc, "compile_file", missing)
    with pytest.raises(nvrtc.CompilerNotFound, match="pip install"):
        lab01.sgemm_tile_report(32)
    assert lab01.sgemm_shared_bytes(2 * 32 * 32 * 4, tile=32) == "right"  # from the source
    assert "one tile" in lab01.sgemm_shared_bytes(32 * 32 * 4, tile=32)
    # 2048 at TILE = 32 is the floats of As and Bs (it is also TILE = 16's bytes)
    assert "counts floats" in lab01.sgemm_shared_bytes(2 * 32 * 32, tile=32)


def test_tile_report_from_the_compiler_when_there_is_one():
    from ckptlab.kernels import nvrtc

    if not (nvrtc.backend_available("nvrtc") or nvrtc.backend_available("nvcc")):
        pytest.skip("neither NVRTC nor nvcc on this machine: " + nvrtc.INSTALL_HINT)
    assert [lab01.sgemm_tile_report(t)["smem"] for t in (8, 16, 32)] == [512, 2048, 8192]


def test_a_compile_error_shows_the_learners_line_not_the_command_line():
    """A missing ';' in the race fix was reported as "the emulator still reports", under g++'s
    600-character command line; now the compiler's first error, at the learner's line, with the
    line before it (a missing ';' is reported on the next one), in a few short lines."""
    racy = lab01.racy_sgemm_source()
    fix = "__syncthreads()  // forgot the semicolon"
    verdict = lab01.race_fixed(racy.replace("// (a barrier was here)", fix))
    lines = verdict.splitlines()
    assert lines[0].startswith("wrong, because your kernel does not compile: line "), verdict
    assert "expected ';'" in lines[0] and any(fix in x for x in lines[1:]), verdict
    assert "g++" not in verdict and "-fsanitize" not in verdict and "$ " not in verdict
    assert "still reports" not in verdict and len(lines) <= 4 and len(verdict) < 400, verdict
    undeclared = lab01.race_fixed(racy.replace("// (a barrier was here)", "syncthreads();"))
    assert "'syncthreads' was not declared" in undeclared and "emu_" not in undeclared


def test_a_value_two_slips_give_gets_both_reasons():
    """2048 at TILE = 32 is both TILE = 16's bytes and TILE = 32's floats; the floats hint used
    to fire first, alone. At H = 2, forgetting H gives the count of multiply-adds; the message
    said only "a multiply-add is 2 FLOPs"."""
    verdict = lab01.sgemm_shared_bytes(2048, tile=32)
    assert "counts floats" in verdict and "TILE = 16" in verdict, verdict
    want = 2 * 1 * 2 * 100 * 100 * 32
    both = lab05.recompute_flops(want // 2, B=1, H=2, N=100, d=32)
    assert "multiply-add" in both and "one head's" in both, both
    three = lab05.recompute_flops(2 * 3 * 100 * 100 * 32 // 3, B=1, H=3, N=100, d=32)
    assert "one head's" in three and "multiply-add" not in three, three


def test_a_function_that_returns_none_is_wrong_not_unanswered():
    """A dS that computes and forgets `return` got "not answered yet"; the shipped `return ...`
    still does."""
    def forgot(P, dP):
        P * (dP - (P * dP).sum(axis=1, keepdims=True))

    verdict = lab03.softmax_backward(forgot)
    assert verdict.startswith("wrong, because ") and "returned None" in verdict, verdict
    assert lab03.softmax_backward(lambda P, dP: ...) == "not answered yet"
    assert "returned None" in lab04.online_merge(lambda *a: None)
