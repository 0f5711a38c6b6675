"""NVRTC called through ctypes, to PTX: the quick way to ask "would a GPU build this?".

ckptlab.kernels.nvrtc reaches NVRTC through cuda.bindings or CuPy, whose import takes a second
or two (CuPy's whole package), and compiles to a cubin, for ptxas' report. The exercise check
asks NVRTC on every new version of a learner's file, before it is built and run: loading the
library itself (libnvrtc.so from the pip wheel nvidia-cuda-nvrtc-cu12, $CUDA_PATH or
/usr/local/cuda) takes milliseconds, and PTX is all it needs. A call to a function no device has
shows in the PTX as an `.extern .func` that no GPU library defines (`externs`), which ptxas
would refuse.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import re
from pathlib import Path

# functions a kernel may call that the CUDA driver links in (printf, device malloc, assert)
DEVICE_EXTERNS = frozenset({"vprintf", "malloc", "free", "__assertfail"})


def _candidates():
    try:
        import nvidia.cuda_nvrtc as wheel  # the pip wheel: a namespace package, cheap to import

        for root in wheel.__path__:
            yield from sorted(Path(root, "lib").glob("libnvrtc.so*"))
    except ImportError:
        pass
    for env in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(env):
            yield from sorted(Path(os.environ[env], "lib64").glob("libnvrtc.so*"))
    yield from sorted(Path("/usr/local/cuda/lib64").glob("libnvrtc.so*"))
    if found := ctypes.util.find_library("nvrtc"):
        yield Path(found)


@functools.lru_cache(maxsize=None)
def load():
    """(the library, its version "12.9"); OSError where no libnvrtc can be loaded."""
    for path in _candidates():
        try:
            lib = ctypes.CDLL(str(path))
        except OSError:
            continue
        major, minor = ctypes.c_int(), ctypes.c_int()
        if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) == 0:
            return lib, f"{major.value}.{minor.value}"
    raise OSError("no libnvrtc.so found (pip install nvidia-cuda-nvrtc-cu12)")


def compile_ptx(source: str, name: str, options, expressions=()) -> tuple[bool, str, str]:
    """(accepted, NVRTC's log, the PTX) for `source` compiled with `options` and template
    instantiations `expressions` (NVRTC name expressions)."""
    lib, _ = load()
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None,
                              None) != 0:
        raise RuntimeError("nvrtcCreateProgram failed")
    try:
        for e in expressions:
            lib.nvrtcAddNameExpression(prog, e.encode())
        opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        ok = lib.nvrtcCompileProgram(prog, len(options), opts) == 0
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        ptx = ""
        if ok:
            lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetPTX(prog, buf)
            ptx = buf.value.decode(errors="replace")
        return ok, log.value.decode(errors="replace"), ptx
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def externs(ptx: str) -> list[str]:
    """The functions the PTX calls but does not define, other than the ones a GPU provides."""
    names = re.findall(r"^\s*\.extern\s+\.func\s+(?:\([^)]*\)\s*)?([A-Za-z_$][\w$]*)", ptx,
                       flags=re.M)
    return [n for n in dict.fromkeys(names) if n not in DEVICE_EXTERNS]
