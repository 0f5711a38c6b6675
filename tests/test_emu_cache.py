"""The build cache is safe to share a machine with: a cache directory (or a file in it) that
another user owns or can write is refused with the fix, lock files are never followed through a
symlink, a damaged library is rebuilt, and a compile killed with -9 leaves nothing behind."""

import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from ckptlab import emu
from ckptlab.emu import build

pytestmark = pytest.mark.counted  # byte counts, bounds and race checks

KERNEL = 'extern "C" __global__ void fill(float* x) {{ x[threadIdx.x] = 3.0f; }} // {tag}\n'
OTHER_UID = 65534  # "nobody"
USUAL_CACHE = build.cache_dir()


def fresh(tag=None) -> str:
    return KERNEL.format(tag=tag or uuid.uuid4().hex)


def run(code: str, name="cache.cu"):
    x = np.zeros(4, np.float32)
    emu.RawModule(code=code, name=name).get_function("fill")((1,), (4,), (x,))
    assert (x == 3).all()


def with_runtime(folder: Path) -> Path:
    """folder, with the runtime object copied in from the usual cache: a test then compiles its
    kernel only (the runtime's build, ~10 s, is what test_emu_build.py covers)."""
    here = os.environ.get("CKPTLAB_CACHE_DIR")
    os.environ["CKPTLAB_CACHE_DIR"] = str(USUAL_CACHE)
    try:
        src = build.runtime_object(build.compiler())
    finally:
        os.environ["CKPTLAB_CACHE_DIR"] = here if here is not None else ""
        if here is None:
            del os.environ["CKPTLAB_CACHE_DIR"]
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    shutil.copyfile(src, folder / src.name)
    os.chmod(folder / src.name, 0o644)
    return folder


def not_mine(path):
    """Make path belong to someone else: chown as root, else stand-in a root-owned folder."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file to another user")
    os.chown(path, OTHER_UID, OTHER_UID)


def test_a_cache_dir_others_can_write_is_refused(tmp_path, monkeypatch):
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(0o777)
    monkeypatch.setenv("CKPTLAB_CACHE_DIR", str(cache))
    with pytest.raises(emu.EmuCompileError, match=r"writable by group or others.*chmod go-w"):
        run(fresh())
    assert not list(cache.iterdir())  # nothing written into it
    cache.chmod(0o700)  # the fix the message gives
    with_runtime(cache)
    run(fresh())


def test_a_cache_dir_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    if os.geteuid() == 0:
        cache = tmp_path / "theirs"
        cache.mkdir(mode=0o755)
        not_mine(cache)
    else:
        cache = Path("/usr")  # root's, not ours
    monkeypatch.setenv("CKPTLAB_CACHE_DIR", str(cache))
    with pytest.raises(emu.EmuCompileError, match=r"owned by (uid|user) .*not by you"):
        run(fresh())


@pytest.mark.slow  # builds a module in a fresh cache
def test_a_new_cache_dir_is_private(tmp_path, monkeypatch):
    cache = tmp_path / "a" / "b"
    monkeypatch.setenv("CKPTLAB_CACHE_DIR", str(cache))  # created by the build, runtime too
    old = os.umask(0o002)  # a common umask: group-writable by default
    try:
        run(fresh())
    finally:
        os.umask(old)
    assert stat.S_IMODE(cache.stat().st_mode) & 0o077 == 0
    for f in cache.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) & 0o022 == 0, f


@pytest.mark.parametrize("attack", ["group-writable", "not-mine"])
def test_a_planted_or_writable_library_is_refused(tmp_path, monkeypatch, attack):
    monkeypatch.setenv("CKPTLAB_CACHE_DIR", str(with_runtime(tmp_path)))
    code = fresh()
    so = build.build_module(code, "plant.cu", ["fill"], (), "counted")
    if attack == "group-writable":
        so.chmod(0o664)
    else:
        not_mine(so)
    with pytest.raises(emu.EmuCompileError, match=rf"{so.name}.*(writable by group|owned by).*"
                                                  r"(delete|remove)"):
        run(code, "plant.cu")


def test_a_lock_file_planted_as_a_symlink_is_not_followed(tmp_path, monkeypatch):
    monkeypatch.setenv("CKPTLAB_CACHE_DIR", str(with_runtime(tmp_path / "cache")))
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    code = fresh()
    target = build.module_path(code, "lock.cu", ["fill"], (), "counted")
    os.symlink(victim, str(target) + ".lock")
    with pytest.raises(emu.EmuCompileError, match=r"\.lock.*symbolic link.*remove"):
        run(code, "lock.cu")
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("damage", [0, 1000])
def test_a_truncated_library_is_rebuilt(tmp_path, monkeypatch, damage):
    monkeypatch.setenv("CKPTLAB_CACHE_DIR", str(with_runtime(tmp_path)))
    code = fresh()
    so = build.build_module(code, "cut.cu", ["fill"], (), "counted")  # built, never loaded
    with open(so, "r+b") as f:
        f.truncate(damage)
    run(code, "cut.cu")
    assert so.stat().st_size > damage


def test_a_compile_killed_with_sigkill_leaves_no_folder_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("CKPTLAB_CACHE_DIR", str(with_runtime(tmp_path)))
    before = {p for p in tmp_path.iterdir() if p.is_dir()}
    script = textwrap.dedent(f"""
        from ckptlab.emu import build
        build.build_module({fresh()!r}, "killed.cu", ["fill"], (), "counted")
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], env=dict(os.environ))
    stale, t0 = set(), time.monotonic()
    while not stale and time.monotonic() - t0 < 60 and proc.poll() is None:
        stale = {p for p in tmp_path.iterdir() if p.is_dir()} - before
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert stale, "the build finished before it could be killed"
    assert all(p.exists() for p in stale)  # what kill -9 leaves
    run(fresh())  # the next build cleans it
    assert not any(p.exists() for p in stale)
