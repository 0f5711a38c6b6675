"""Where the emulator's built libraries live, and building into that folder safely.

The cache is $CKPTLAB_CACHE_DIR, else $XDG_CACHE_HOME/ckptlab/emu, else ~/.cache/ckptlab/emu. A
library from it runs inside the Python process, so nobody else may be able to write it: the
folder (and every folder above it) must belong to you or root and be writable by nobody else
(sticky folders such as /tmp excepted above it), and so must every file taken from it; lock files
are opened without following symbolic links. A folder the cache creates is private (mode 700).
A library cut short (a full disk, a copy interrupted) is rebuilt; a build killed with -9 leaves
a folder behind, which the next build removes.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import struct
import tempfile
import time
from pathlib import Path

from .errors import EmuCompileError

STALE_S = 24 * 3600  # a temporary build folder whose process we cannot tell apart: after a day


class UnsafeCache(EmuCompileError):
    """The cache folder, or a file in it, could have been written by someone else."""


def cache_dir() -> Path:
    root = os.environ.get("CKPTLAB_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "ckptlab" / "emu"


def _who(uid: int) -> str:
    try:
        return f"user {pwd.getpwuid(uid).pw_name!r} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _fix_hint() -> str:
    return ("; or point CKPTLAB_CACHE_DIR at a folder of your own (created with mode 700 when "
            "missing)")


def secure_dir(path: Path) -> Path:
    """Create path (mode 700) if missing, then refuse it if others could write it or above it."""
    path = Path(os.path.abspath(path))
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:
            pass
    me = os.geteuid()
    for i, p in enumerate([path, *path.parents]):
        st = os.stat(p)
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafeCache(f"emulator cache {path}: {p} is not a folder")
        if i == 0 and st.st_uid != me:
            raise UnsafeCache(f"emulator cache {path} is owned by {_who(st.st_uid)}, not by you "
                              f"({_who(me)}): its libraries would run in your process"
                              + _fix_hint())
        if st.st_uid not in (me, 0):
            raise UnsafeCache(f"emulator cache {path}: the folder {p} above it is owned by "
                              f"{_who(st.st_uid)}, who could replace the cache" + _fix_hint())
        if st.st_mode & 0o022 and not (i > 0 and st.st_mode & stat.S_ISVTX):
            raise UnsafeCache(f"emulator cache {path}: {p} is writable by group or others, who "
                              f"could plant a library there: fix it with `chmod go-w {p}`"
                              + _fix_hint())
    return path


def check_file(path: Path) -> None:
    """Refuse a cached file that is a symlink, someone else's, or writable by others."""
    st = os.lstat(path)
    problem = None
    if stat.S_ISLNK(st.st_mode):
        problem = "is a symbolic link"
    elif st.st_uid != os.geteuid():
        problem = f"is owned by {_who(st.st_uid)}, not by you"
    elif st.st_mode & 0o022:
        problem = "is writable by group or others"
    if problem:
        raise UnsafeCache(f"emulator cache: {path} {problem}, so it may not be what ckptlab "
                          f"built; delete it (`rm {path}`) and it is rebuilt")


def complete_elf(path: Path) -> bool:
    """True if path holds a whole 64-bit ELF file: every header and segment within its size."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2:
                return False
            phoff, shoff = struct.unpack_from("<QQ", head, 0x20)
            phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 0x36)
            if shoff + shnum * shentsize > size or phoff + phnum * phentsize > size:
                return False
            for i in range(phnum):
                f.seek(phoff + i * phentsize)
                ph = f.read(phentsize)
                offset, filesz = struct.unpack_from("<Q", ph, 0x08)[0], struct.unpack_from(
                    "<Q", ph, 0x20)[0]
                if offset + filesz > size:
                    return False
        return True
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(folder: Path) -> None:
    """Remove temporary build folders whose process is gone (kill -9 during a compile)."""
    now = time.time()
    for p in folder.iterdir():
        if not p.is_dir() or p.is_symlink():
            continue
        parts = p.name.split("-")
        if p.name.startswith("build-") and len(parts) >= 3 and parts[1].isdigit():
            stale = not _alive(int(parts[1])) or now - p.stat().st_mtime > STALE_S
        else:  # older versions' folders (tmpXXXX): by age only
            stale = p.name.startswith("tmp") and now - p.stat().st_mtime > 3600
        if stale and p.stat().st_uid == os.geteuid():
            shutil.rmtree(p, ignore_errors=True)


def _open_lock(path: Path) -> int:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if os.path.islink(path):
            raise UnsafeCache(f"emulator cache: {path} is a symbolic link (planted to make the "
                              f"build overwrite another file?); remove it (`rm {path}`)") from e
        raise
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        check_file(path)  # says what is wrong
    return fd


def locked_build(target: Path, build, valid=complete_elf) -> Path:
    """Build `target` once, even when several processes race for it; rebuild it if it is not
    valid (cut short); refuse it if someone else could have written it."""
    import fcntl

    folder = secure_dir(target.parent)
    if target.exists() or target.is_symlink():
        check_file(target)
        if valid(target):
            return target
    fd = _open_lock(Path(str(target) + ".lock"))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        clean_stale(folder)
        if target.exists() and not target.is_symlink():
            check_file(target)
            if valid(target):
                return target
        tmp = Path(tempfile.mkdtemp(prefix=f"build-{os.getpid()}-", dir=folder))
        try:
            out = tmp / target.name
            build(tmp, out)
            os.chmod(out, 0o644)  # whatever the umask: nobody else may write it
            os.replace(out, target)  # atomic: others see all of it or none
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    return target
