"""occupancy.prefetch: the compiler's reports the time model will ask for, compiled on several
threads at once (a cold lab 08 compiles some forty instantiations); afterwards resources()
reads them from disk and compiles nothing."""

import threading

import pytest

from ckptlab.kernels import nvrtc
from ckptlab.measure import occupancy

KERNELS = ["attn_naive_scores", "attn_naive_bwd_dv", "attn_naive_softmax"]  # two files


def test_prefetch_compiles_in_threads_then_resources_compiles_nothing(tmp_path, monkeypatch):
    try:
        nvrtc.compile_file  # noqa: B018
        nvrtc._nvrtc()
    except nvrtc.CompilerNotFound as e:
        pytest.skip(f"no CUDA compiler here: {e}")
    monkeypatch.setenv("CKPTLAB_CACHE_DIR", str(tmp_path))
    occupancy._compiled.cache_clear()
    occupancy.resources.cache_clear()
    calls, real = [], nvrtc.compile_records  # the compiler itself, behind compile_file's cache

    def recording(path, arch, *args, **kw):
        calls.append((path.name, threading.get_ident()))
        return real(path, arch, *args, **kw)

    monkeypatch.setattr(nvrtc, "compile_records", recording)
    occupancy.prefetch(KERNELS, "sm_80", workers=2)
    assert sorted(name for name, _ in calls) == ["attn_naive_bwd.cu", "attn_naive_fwd.cu"]
    assert all(tid != threading.get_ident() for _, tid in calls)  # on the pool's threads
    occupancy._compiled.cache_clear()  # only the disk remains
    for k in KERNELS:
        assert occupancy.resources(k, "sm_80").registers > 0
    assert len(calls) == 2, calls  # read back, not compiled again
    with pytest.raises(ValueError, match="arch"):
        occupancy.prefetch(KERNELS, "sm_1")
    occupancy._compiled.cache_clear()
    occupancy.resources.cache_clear()
