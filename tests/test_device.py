"""ckptlab.device on a machine without a GPU: the "cuda" path of load() is driven through a
stand-in CuPy module that records what it is asked to compile (the real compile runs under
`-m gpu`, in test_emu_gpu.py and test_attention_gpu.py)."""

import shutil
import sys
from types import SimpleNamespace

import pytest

from ckptlab import device


class _RecordingCupy:
    """Stands in for `cupy`: RawModule records its options instead of compiling."""

    def __init__(self):
        self.compiled = []

    def RawModule(self, code, options, name_expressions=None):  # noqa: N802 (CuPy's name)
        self.compiled.append(tuple(options))
        return SimpleNamespace(code=code, options=tuple(options))


@pytest.fixture
def fake_cuda(monkeypatch, tmp_path):
    """The "cuda" target on a stand-in CuPy, with kernels/ copied to tmp_path (free to edit)."""
    kernels = tmp_path / "kernels"
    shutil.copytree(device.KERNELS_DIR, kernels)
    cp = _RecordingCupy()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setattr(device, "cuda_available", lambda: True)
    monkeypatch.setattr(device, "KERNELS_DIR", kernels)
    monkeypatch.setattr(device, "_modules", {})
    with device.use("cuda"):
        yield cp, kernels


def _stamp(options):
    hits = [o for o in options if o.startswith("-DCKPTLAB_HEADERS_HASH=")]
    assert len(hits) == 1, options
    return hits[0]


def test_an_edited_header_changes_the_compile_options(fake_cuda, monkeypatch):
    """CuPy's disk cache keys on source + options: a header edit must change the options."""
    cp, kernels = fake_cuda
    device.load("softmax_rows.cu")
    device.load("softmax_rows.cu")  # the same process: served from memory, not compiled again
    assert len(cp.compiled) == 1
    before = _stamp(cp.compiled[0])

    monkeypatch.setattr(device, "_modules", {})  # a new process, same files: same options
    device.load("softmax_rows.cu")
    assert _stamp(cp.compiled[1]) == before

    header = kernels / "common.cuh"
    header.write_text(header.read_text() + "\n// an edit\n")
    monkeypatch.setattr(device, "_modules", {})  # a new process after the edit
    device.load("softmax_rows.cu")
    assert _stamp(cp.compiled[2]) != before


def test_every_header_counts_and_the_user_options_are_kept(fake_cuda, monkeypatch):
    cp, kernels = fake_cuda
    device.load("sgemm_tiled.cu", options=("-DEXTRA=1",))
    assert "-DEXTRA=1" in cp.compiled[0] and f"-I{kernels}" in cp.compiled[0]
    first = _stamp(cp.compiled[0])
    headers = sorted(kernels.glob("*.cuh"))
    assert len(headers) >= 2  # common.cuh and philox.cuh at least
    for h in headers:  # each header on its own moves the stamp
        saved = h.read_bytes()
        h.write_bytes(saved + b"\n")
        monkeypatch.setattr(device, "_modules", {})
        device.load("sgemm_tiled.cu", options=("-DEXTRA=1",))
        assert _stamp(cp.compiled[-1]) != first, h.name
        h.write_bytes(saved)
    (kernels / "new_helper.cuh").write_text("#pragma once\n")  # a header added counts too
    monkeypatch.setattr(device, "_modules", {})
    device.load("sgemm_tiled.cu", options=("-DEXTRA=1",))
    assert _stamp(cp.compiled[-1]) != first


def test_the_emulator_gets_no_stamp(monkeypatch):
    """The emulator's own build cache hashes the headers it includes; the define is CuPy's."""
    seen = []
    from ckptlab import emu

    monkeypatch.setattr(emu, "RawModule", lambda code, options, **kw: seen.append(options))
    monkeypatch.setattr(device, "_modules", {})
    with device.use("emu"):
        device.load("softmax_rows.cu")
    assert seen and not any("CKPTLAB_HEADERS_HASH" in o for o in seen[0])


def test_no_driver_answers_without_importing_cupy():
    """On a Linux machine with no NVIDIA driver (this one), cuda_available() is False without
    importing CuPy, whose import takes seconds; with a driver's file present it asks CuPy."""
    import subprocess
    import sys

    code = ("import sys; from ckptlab import device; "
            "print(device.cuda_available(), 'cupy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if not device.no_driver():
        pytest.skip("this machine shows an NVIDIA driver: CuPy is asked")
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr


def test_a_driver_file_sends_the_question_to_cupy(monkeypatch):
    monkeypatch.setattr(device.sys, "platform", "linux")
    monkeypatch.setattr(device.os.path, "exists", lambda p: p == "/dev/dxg")
    assert not device.no_driver()
    monkeypatch.setattr(device.os.path, "exists", lambda p: False)
    assert device.no_driver()
    monkeypatch.setattr(device.sys, "platform", "win32")
    assert not device.no_driver()  # elsewhere CuPy decides
