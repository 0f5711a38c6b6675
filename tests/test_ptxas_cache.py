"""The compiler's reports kept on disk (ckptlab.kernels.ptxas_cache): the key changes with
everything a record depends on (the .cu file's contents, every header beside it, the arch, the
compiler's label, the instantiations, the defines, the include folders) and with nothing else;
compile_file reads a kept record instead of compiling, compiles again and replaces a corrupt
one, and never keeps a failed compile. No CUDA compiler is needed: the compile is a stand-in
that counts its calls."""

import json
import os
import shutil
from pathlib import Path

import pytest

from ckptlab.device import KERNELS_DIR
from ckptlab.kernels import nvrtc, ptxas_cache

KEY = dict(arch="sm_80", label="nvrtc 12.9 (binding)", names=["k<64>"], defines={"TILE": 16},
           include_dirs=("/cuda/include",))


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A copy of the kernels folder (a .cu file and the headers beside it) and a private cache."""
    monkeypatch.setenv("CKPTLAB_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "kernels"
    src.mkdir()
    for f in [KERNELS_DIR / "sgemm_tiled.cu", *KERNELS_DIR.glob("*.cuh")]:
        shutil.copy(f, src / f.name)
    return src


def key(path, **change):
    return ptxas_cache.path_for(path, **{**KEY, **change})


def test_the_key_changes_with_each_thing_a_record_depends_on(folder):
    cu = folder / "sgemm_tiled.cu"
    before = key(cu)
    assert before == key(cu) and before.parent.name == "ptxas-records"
    assert before.name.startswith("sgemm_tiled.cu-sm_80-")
    changed = {"arch": key(cu, arch="sm_90"), "label": key(cu, label="nvrtc 12.4 (binding)"),
               "names": key(cu, names=["k<128>"]), "defines": key(cu, defines={"TILE": 32}),
               "include_dirs": key(cu, include_dirs=("/other/include",))}
    for what, path in changed.items():
        assert path != before, f"the key ignores {what}"
    cu.write_text(cu.read_text() + "\n// one more line\n")  # the file's own contents
    assert key(cu) != before, "the key ignores the .cu file's contents"
    cu.write_text(cu.read_text().removesuffix("\n// one more line\n"))
    assert key(cu) == before
    for header in sorted(folder.glob("*.cuh")):  # each header beside it, one at a time
        text = header.read_text()
        header.write_text(text + "\n// edited\n")
        assert key(cu) != before, f"the key ignores {header.name}"
        header.write_text(text)
    (folder / "extra.h").write_text("// a new header the file might include\n")
    assert key(cu) != before, "the key ignores a .h header beside the file"


def test_the_key_ignores_what_a_record_does_not_depend_on(folder):
    cu = folder / "sgemm_tiled.cu"
    before = key(cu)
    os.utime(cu, (1, 1))  # times
    (folder / "notes.txt").write_text("not a header")  # other files
    assert key(cu) == before
    assert key(cu, defines={"TILE": 16}) == key(cu, defines={"TILE": 16})
    assert key(cu, defines={"A": 1, "B": 2}) == key(cu, defines={"B": 2, "A": 1})  # dict order


def compile_file_counting(folder, monkeypatch, fail=False):
    """nvrtc.compile_file on folder's sgemm_tiled.cu with a stand-in compiler: (run, calls)."""
    calls = []

    def compile_records(path, arch, backend, names, defines):
        calls.append(path)
        if fail:
            raise nvrtc.CompileError(path, arch, backend, "error: stand-in failure")
        return [{**{k: 0 for k in ptxas_cache.RECORD_KEYS}, "file": Path(path).name,
                 "kernel": "sgemm_tiled", "kind": "kernel", "arch": arch, "registers": 40,
                 "backend": "nvcc 12.0"}]

    monkeypatch.setattr(nvrtc, "_pick_backend", lambda backend: "nvcc")
    monkeypatch.setattr(nvrtc, "_nvcc_version", lambda nvcc: "12.0")
    monkeypatch.setattr(nvrtc, "compile_records", compile_records)
    return (lambda: nvrtc.compile_file(folder / "sgemm_tiled.cu", "sm_80")), calls


def test_a_kept_record_is_read_and_a_corrupt_one_compiled_again(folder, monkeypatch):
    run, calls = compile_file_counting(folder, monkeypatch)
    first = run()
    assert len(calls) == 1 and first[0]["registers"] == 40
    assert run() == first and len(calls) == 1  # read back, not compiled
    (kept,) = (Path(os.environ["CKPTLAB_CACHE_DIR"]) / "ptxas-records").iterdir()
    for corrupt in ("", "{not json", "{}", "[1, 2]", '[{"kernel": "sgemm_tiled"}]', "null",
                    json.dumps([{**first[0], "registers": 40}])[:-5]):
        kept.write_text(corrupt)
        n = len(calls)
        assert run() == first, corrupt  # compiled again, not a crash or a wrong record
        assert len(calls) == n + 1, corrupt
        assert json.loads(kept.read_text()) == first  # and replaced by a good one
    n = len(calls)
    (folder / "common.cuh").write_text((folder / "common.cuh").read_text() + "\n// edit\n")
    run()
    assert len(calls) == n + 1  # a changed header: compiled again, kept beside the first
    assert len(list(kept.parent.iterdir())) == 2


def test_a_failed_compile_is_not_kept(folder, monkeypatch):
    run, calls = compile_file_counting(folder, monkeypatch, fail=True)
    for _ in range(2):
        with pytest.raises(nvrtc.CompileError, match="stand-in failure"):
            run()
    assert len(calls) == 2
    assert not (Path(os.environ["CKPTLAB_CACHE_DIR"]) / "ptxas-records").exists()
