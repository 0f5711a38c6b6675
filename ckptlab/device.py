"""The target the kernels run on: "cuda" (CuPy RawModule on an NVIDIA GPU) or "emu" (the CPU
emulator in ckptlab.emu, NumPy arrays).

The default is "cuda" when `cupy.cuda.is_available()`, else "emu". `CKPTLAB_DEVICE=cuda|emu`
forces one; forcing "cuda" without a GPU is an error, never a silent fallback. Nothing else in
ckptlab imports CuPy: ask this module for the array module (`xp()`) and for kernels (`load`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from pathlib import Path

TARGETS = ("cuda", "emu")
KERNELS_DIR = Path(
    os.environ.get("CKPTLAB_KERNELS", Path(__file__).resolve().parent.parent / "kernels")
)

_forced: str | None = None  # set by use(); wins over the environment
_modules: dict = {}  # (target, file, source digest, options, name_expressions) -> module
_overrides: dict = {}  # kernel file name -> (source text, name errors use); see kernel_file()
_poisoned: dict = {}  # overridden file -> "pattern" or "zero": how its locals start (emulator)


class DeviceError(RuntimeError):
    """The requested target cannot be used on this machine."""


# Where an NVIDIA driver shows itself on Linux: its control device, the first GPU, its /proc
# entry, or WSL2's GPU device (CUDA on WSL2 goes through /dev/dxg)
DRIVER_PATHS = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia", "/dev/dxg")


def no_driver() -> bool:
    """True on a Linux machine with no trace of an NVIDIA driver, where no GPU can be used.
    It answers in microseconds what importing CuPy answers in seconds (measured: 2.2-2.8 s of
    a 4 s `exercise check` on a 2-core machine)."""
    return sys.platform.startswith("linux") and not any(os.path.exists(p)
                                                         for p in DRIVER_PATHS)


def cuda_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    if no_driver():
        return False
    try:
        import cupy
    except Exception:
        return False
    try:
        return bool(cupy.cuda.is_available())
    except Exception:
        return False


def _check(name: str, source: str) -> str:
    if name not in TARGETS:
        raise DeviceError(f"unknown target {name!r} ({source}); expected one of {TARGETS}")
    if name == "cuda" and not cuda_available():
        raise DeviceError(
            f"target 'cuda' was asked for ({source}) but no CUDA device is visible: CuPy is "
            "missing or cupy.cuda.is_available() is False. Use 'emu' (the CPU emulator) or "
            "install a GPU build of CuPy (pip install cupy-cuda12x) on a machine with a GPU."
        )
    return name


def target() -> str:
    """The current target: use() if set, else $CKPTLAB_DEVICE, else cuda if present, else emu."""
    if _forced is not None:
        return _forced
    env = os.environ.get("CKPTLAB_DEVICE", "").strip().lower()
    if env:
        return _check(env, "CKPTLAB_DEVICE")
    return "cuda" if cuda_available() else "emu"


@contextlib.contextmanager
def _restore(previous):
    global _forced
    try:
        yield _forced
    finally:
        _forced = previous


def use(name: str | None):
    """Force the target for this process (None: back to the default). Usable as a context
    manager: `with device.use("emu"): ...` restores the previous choice on exit."""
    global _forced
    previous = _forced
    _forced = None if name is None else _check(name.strip().lower(), "device.use()")
    return _restore(previous)


def xp(name: str | None = None):
    """The array module of a target: cupy on "cuda", numpy on "emu"."""
    if (name or target()) == "cuda":
        import cupy

        return cupy
    import numpy

    return numpy


def is_device_array(a, name: str | None = None) -> bool:
    """True if `a` is an array of the target's module (a CuPy array on cuda, NumPy on emu)."""
    return type(a).__module__.split(".")[0] == xp(name).__name__


def to_numpy(a):
    """Copy an array of either module to a NumPy array on the host."""
    if type(a).__module__.split(".")[0] == "cupy":
        return a.get()
    import numpy

    return numpy.asarray(a)


def synchronize() -> None:
    """Wait for queued GPU work (a no-op on the emulator, which runs launches synchronously)."""
    if target() == "cuda":
        import cupy

        cupy.cuda.get_current_stream().synchronize()


def free_bytes() -> int | None:
    """Bytes the cuda target can still allocate: the device's free memory plus what CuPy's pool
    holds unused; None on the emulator (host memory: the labs' CPU sizes are small)."""
    if target() != "cuda":
        return None
    cp = xp("cuda")
    free, _ = cp.cuda.runtime.memGetInfo()
    pool = cp.get_default_memory_pool()
    return int(free + pool.free_bytes())


def kernel_source(filename: str) -> str:
    """The source load() compiles for kernels/<filename>: the file, or what kernel_file() put in
    its place."""
    if filename in _overrides:
        return _overrides[filename][0]
    path = KERNELS_DIR / filename
    if not path.is_file():
        raise FileNotFoundError(f"no kernel file {filename!r} in {KERNELS_DIR}")
    return path.read_text()


@contextlib.contextmanager
def kernel_file(filename: str, source: str, name: str | None = None,
                poison_locals: bool | str = False):
    """Inside the block, load(filename) compiles `source` instead of kernels/<filename>: how a
    learner's own kernel runs behind the lab's launch wrappers, which stay as they are. `name`
    is the file name compile errors and faults report (the learner's own path); headers still
    come from kernels/. With `poison_locals`, on the emulator every local variable of the file
    starts as a huge negative pattern (emu.build.POISON_LOCALS), so a read before the first
    write shows; with poison_locals="zero", as 0 (to compare the two). Blocks nest; each
    restores what was there before."""
    if not isinstance(source, str):
        raise TypeError(f"source must be the kernel's text (a str), got {type(source).__name__}")
    previous, was = _overrides.get(filename), _poisoned.pop(filename, None)
    _overrides[filename] = (source, name or filename)
    if poison_locals:
        _poisoned[filename] = "zero" if poison_locals == "zero" else "pattern"
    try:
        yield
    finally:
        if previous is None:
            _overrides.pop(filename, None)
        else:
            _overrides[filename] = previous
        _poisoned.pop(filename, None)
        if was is not None:
            _poisoned[filename] = was
def kernel_header(filename: str, keep=(), drop=()) -> str:
    """The header comment of kernels/<filename> (every line before the first #include), as a
    lab prints it: only its paragraphs (runs of lines between blank `//` lines) that contain one
    of the phrases in `keep` (all of them when `keep` is empty), without the lines that contain a
    phrase in `drop` (an exercise's answer, a caveat for another lab). A phrase that matches
    nothing raises ValueError, so a lab notices when the header it quotes changes."""
    head = kernel_source(filename).split("#include")[0].rstrip().splitlines()
    paragraphs, current = [], []
    for line in head:
        if line.strip() == "//":
            if current:
                paragraphs.append(current)
            current = []
        else:
            current.append(line)
    if current:
        paragraphs.append(current)
    missing = [k for k in (*keep, *drop) if k not in "\n".join(head)]
    if missing:
        raise ValueError(f"{filename}'s header has none of {missing}")
    if keep:
        paragraphs = [p for p in paragraphs if any(k in line for k in keep for line in p)]
    lines = ["\n".join(x for x in p if not any(d in x for d in drop)) for p in paragraphs]
    return "\n//\n".join(x for x in lines if x)


def headers_hash() -> str:
    """SHA-256 (first 16 hex digits) of every kernels/*.cuh, names and contents, in name order.

    CuPy's on-disk kernel cache keys on the .cu source, the options, the arch and the name
    expressions, not on the headers a file includes: without this in the options, an edited
    .cuh would keep running the binary compiled from the old one."""
    h = hashlib.sha256()
    for path in sorted(KERNELS_DIR.glob("*.cuh")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def load(filename: str, options: tuple = (), name_expressions: tuple | None = None):
    """Load kernels/<filename> for the current target, once per process per (target, options).

    Returns a module with CuPy's RawModule surface: `get_function(name)`, and each function is
    called as `f(grid, block, args, shared_mem=0)`. On "cuda" the options carry
    -DCKPTLAB_HEADERS_HASH=<headers_hash()>, so CuPy's disk cache misses when a header changes
    (the emulator's own cache already hashes the headers it includes).
    """
    name = target()
    options = tuple(options)
    names = tuple(name_expressions) if name_expressions else None
    code = kernel_source(filename)
    shown = _overrides[filename][1] if filename in _overrides else filename
    digest = hashlib.sha256(code.encode()).hexdigest()[:16] if filename in _overrides else None
    key = (name, filename, digest, options, names, _poisoned.get(filename))
    if key in _modules:
        return _modules[key]
    include = (f"-I{KERNELS_DIR}",)
    if name == "cuda":
        import cupy

        stamp = (f"-DCKPTLAB_HEADERS_HASH={headers_hash()}",)
        module = cupy.RawModule(
            code=code, options=("-std=c++17",) + include + stamp + options,
            name_expressions=names,
        )
    else:
        from ckptlab import emu
        from ckptlab.emu.build import poison_locals_flag

        if filename in _poisoned:
            options = options + poison_locals_flag(_poisoned[filename])
        module = emu.RawModule(
            code=code, options=include + options, name_expressions=names, name=shown
        )
    _modules[key] = module
    return module
