"""Turn a .cu file into a shared library the emulator can load: rewrite what host C++ cannot
say (rewrite.py), append one launcher per kernel, compile with g++ (two variants: "fast" plain,
"counted" with GCC's memory-access hooks), link it with the runtime (scheduler.cpp, warps.cpp,
memory.cpp, atomics.cpp, races.cpp, objects.cpp, regions.cpp, signals.cpp, trace.cpp,
workers.cpp, launch.cpp) and cache the result (cache.py), keyed by a hash of everything that
affects the binary: the source, the headers it may include, shim.h, the runtime's sources, the
flags and the compiler's version.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from .cache import cache_dir, complete_elf, locked_build
from .errors import CompilerUnusable, EmuCompileError, EmuError
from .rewrite import launcher_code, rewrite_source

HERE = Path(__file__).resolve().parent
SHIM = HERE / "shim.h"
# CUDA's headers the emulator provides itself (cuda_fp16.h, cuda_bf16.h, mma.h), searched after
# the kernel's own -I folders
INCLUDE = HERE / "include"
RUNTIME = [HERE / n for n in ("abi.h", "runtime.h", "scheduler.cpp", "warps.cpp", "memory.cpp",
                              "atomics.cpp", "races.cpp", "objects.cpp", "regions.cpp",
                              "signals.cpp", "trace.cpp", "workers.cpp", "launch.cpp")]

BASE_FLAGS = [
    "-std=c++20", "-O2", "-g", "-fPIC", "-fvisibility=hidden",
    "-fno-strict-aliasing",        # CUDA code reinterprets float* as float4* freely
    "-fno-exceptions",
    "-fno-plt",                    # calls into libc go straight from the caller (signals.cpp)
    "-fstack-clash-protection",    # big frames touch the guard page first: a clean overflow
    "-Wno-unused-parameter", "-Wno-unused-variable",
]
# The runtime keeps all its code in one section, which build renames (objcopy) so that a timer
# tick can tell the kernel's code from the runtime's (regions.cpp), and its data likewise.
RUNTIME_FLAGS = ["-fno-reorder-functions", "-fno-reorder-blocks-and-partition"]
RUNTIME_SECTIONS = {".text": "emu_runtime_text", ".data": "emu_runtime_data",
                    ".bss": "emu_runtime_bss"}
# GCC calls __tsan_{read,write}{1,2,4,8,16} before every access; memory.cpp defines them. No
# TSan runtime is linked. (ThreadSanitizer's instrumentation, not AddressSanitizer's: ASan skips
# the store of `x[i] += v` after checking the load, so that write would go uncounted.)
COUNT_FLAGS = [
    "-fsanitize=thread",
    "--param", "tsan-instrument-func-entry-exit=0",
    "--param", "tsan-distinguish-volatile=0",
]
# GCC checks each dereference against its type's alignment and calls
# __ubsan_handle_type_mismatch_v1 (signals.cpp) where it fails: a float4 through a misaligned
# pointer is reported even where GCC splits it into scalar loads. No UBSan runtime is linked.
ALIGN_FLAGS = ["-fsanitize=alignment"]
MODES = ("counted", "fast")
__all__ = ["EmuCompileError", "EmuError", "build_module", "cache_dir", "module_path",
           "rewrite_source", "source_line"]


# GCC 10 is the first to take -std=c++20 (GCC 10 release notes, "C++20": "-std=c++20"; GCC 8-9
# call it -std=c++2a); GCC's -fsanitize=thread hooks and ELF objects (objcopy, -Wl,-z,defs)
# need Linux: clang (macOS's g++) and native Windows build neither.
MIN_GCC = 10
WAY_OUT = ("use a Linux machine with g++: WSL2 on Windows, Docker (the repository's Dockerfile: "
           "docker build -t ckptlab .), or a Colab or Kaggle notebook (CPU or GPU runtime)")


def compiler() -> str:
    """Path of the C++ compiler ($CXX or g++), checked once (check_compiler); else
    CompilerUnusable, one line saying what to install or where to run instead."""
    name = os.environ.get("CXX", "g++")
    path = shutil.which(name)
    if path is None:
        raise CompilerUnusable(
            f"ckptlab's CPU emulator needs g++ >= {MIN_GCC} to build the kernels, and {name!r} "
            "is not on the PATH: install it (`sudo apt install g++` on Debian/Ubuntu, `sudo dnf "
            f"install gcc-c++` on Fedora) or set CXX to a g++ you have; or {WAY_OUT}")
    if path not in _checked:
        check_compiler(path)
        _checked.add(path)
    return path


_versions: dict = {}
_checked: set = set()


def compiler_version(cxx: str) -> str:
    if cxx not in _versions:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True)
        _versions[cxx] = out.stdout.splitlines()[0] if out.stdout else cxx
    return _versions[cxx]


def check_compiler(cxx: str, platform: str = sys.platform) -> None:
    """CompilerUnusable, one line, unless `cxx` is GCC >= MIN_GCC on Linux."""
    if not platform.startswith("linux"):
        raise CompilerUnusable(
            f"ckptlab's CPU emulator builds its kernels only on Linux (GCC's memory-access "
            f"hooks, ELF objects), and this is {platform!r}: {WAY_OUT}")
    try:
        said = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
        dumped = subprocess.run([cxx, "-dumpfullversion"], capture_output=True, text=True,
                                timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CompilerUnusable(f"the C++ compiler {cxx} does not run ({e}): set CXX to a "
                               f"g++ >= {MIN_GCC}, or {WAY_OUT}") from None
    first = (said.stdout.strip().splitlines() or ["(nothing)"])[0]
    if said.returncode or "clang" in said.stdout.lower():
        raise CompilerUnusable(
            f"{cxx} is not GCC ({first!r}): the emulator needs GCC >= {MIN_GCC} (its "
            "memory-access hooks; on macOS g++ is clang): set CXX to a real g++, or " + WAY_OUT)
    m = re.match(r"(\d+)\.", dumped.stdout.strip() + ".")
    if dumped.returncode or not m or int(m[1]) < MIN_GCC:
        raise CompilerUnusable(
            f"{cxx} is GCC {dumped.stdout.strip() or '?'} ({first!r}); the emulator needs GCC >= "
            f"{MIN_GCC} (C++20): install a newer g++ and set CXX to it, or {WAY_OUT}")


def _include_dirs(options) -> list[str]:
    dirs, it = [], iter(options)
    for opt in it:
        if opt == "-I":
            dirs.append(next(it, ""))
        elif opt.startswith("-I"):
            dirs.append(opt[2:])
    return [d for d in dirs if d]


# Under the exercise check, every local variable a thread declares starts as a pattern (GCC's
# 0xFE bytes: a float of -1.69e38), as compute-sanitizer's initcheck would flag its first read:
# an accumulator never set to 0 then reads that huge value instead of whatever the register
# held before (finite garbage that looks like any other wrong sum). Filling the fibers' stacks
# would not do: at -O2 such a local lives in a register, never on the stack.
POISON_LOCALS = "-ftrivial-auto-var-init=pattern"
ZERO_LOCALS = "-ftrivial-auto-var-init=zero"  # the same locals set to 0: a second run compares
POISON_GCC = 12  # the first GCC with the option
POISON_FLOAT = float.fromhex("-0x1.fdfdfcp+126")  # 0xFEFEFEFE read as a float


def poison_locals_flag(kind: str = "pattern") -> tuple[str, ...]:
    """(POISON_LOCALS,) (or ZERO_LOCALS for kind "zero") where the compiler knows it (GCC >=
    12), else () (older GCC: the check runs without it, as before)."""
    cxx = compiler()
    if cxx not in _poison_ok:
        out = subprocess.run([cxx, "-dumpfullversion"], capture_output=True, text=True)
        m = re.match(r"(\d+)\.", out.stdout.strip() + ".")
        _poison_ok[cxx] = bool(m) and int(m[1]) >= POISON_GCC
    if not _poison_ok[cxx]:
        return ()
    return (ZERO_LOCALS,) if kind == "zero" else (POISON_LOCALS,)


_poison_ok: dict = {}


def host_flags(options) -> list[str]:
    """Keep the options that mean the same to g++ (-I, -D, -U, and the poison of locals);
    NVRTC-only ones are dropped."""
    keep, it = [], iter(options)
    for opt in it:
        if opt in ("-I", "-D", "-U"):
            keep += [opt, next(it, "")]
        elif opt[:2] in ("-I", "-D", "-U") or opt in (POISON_LOCALS, ZERO_LOCALS):
            keep.append(opt)
    return keep


def _digest(parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


HEADER_SUFFIXES = (".h", ".cuh", ".hpp", ".inc")


def _headers(options) -> list[bytes]:
    out = []
    for d in _include_dirs(options):
        p = Path(d)
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                if f.suffix in HEADER_SUFFIXES and f.is_file():
                    out += [str(f).encode(), f.read_bytes()]
    return out


def _rewritten_includes(options, tmp: Path) -> list[str]:
    """Headers of each -I folder, rewritten like the kernel file (a __shared__ array in
    common.cuh must be counted too), in folders searched before the originals."""
    flags = []
    for i, d in enumerate(_include_dirs(options)):
        src = Path(d)
        if not src.is_dir():
            continue
        dst = tmp / f"include{i}"
        for f in src.rglob("*"):
            if f.suffix in HEADER_SUFFIXES and f.is_file():
                target = dst / f.relative_to(src)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(f"#line 1 \"{f.name}\"\n" + rewrite_source(f.read_text()))
        flags += ["-I", str(dst)]
    return flags


# One g++ run (a kernel file, a runtime source, a link) still going after this many seconds is
# stopped: the labs' kernel files build in seconds, and a source that keeps the compiler busy
# for minutes (templates recursing deep, a huge unrolled loop) would otherwise
# keep whatever built it silent. CKPTLAB_EMU_BUILD_TIMEOUT_S sets it; the exercise checker lowers
# it for a learner's file (ckptlab.exercises.write.child).
DEFAULT_BUILD_LIMIT_S = 600.0
BUILD_LIMIT_S: float | None = None  # set by a caller to lower it for its builds


def build_limit_s() -> float:
    """The time limit of one compiler run, in seconds."""
    if BUILD_LIMIT_S is not None:
        return BUILD_LIMIT_S
    raw = os.environ.get("CKPTLAB_EMU_BUILD_TIMEOUT_S", "").strip()
    if not raw:
        return DEFAULT_BUILD_LIMIT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0:
        raise EmuCompileError(f"CKPTLAB_EMU_BUILD_TIMEOUT_S must be a number of seconds > 0, "
                              f"got {raw!r}")
    return seconds


def _run(cmd, what):
    env = dict(os.environ, LC_ALL="C", LANG="C")  # plain ASCII quotes in the messages
    limit = build_limit_s()
    # a session of its own: on time-out the compiler's own children (cc1plus, as) stop too
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise EmuCompileError(f"{what} did not finish in {limit:g} s and was stopped "
                              "(a source that keeps the compiler this busy: templates "
                              "recursing deep, a huge unrolled loop?)") from None
    if proc.returncode != 0:
        raise EmuCompileError(f"{what} failed:\n$ {' '.join(cmd)}\n{err.strip()}")


def _runtime_bytes() -> list[bytes]:
    return [f.read_bytes() for f in RUNTIME]


def runtime_object(cxx: str) -> Path:
    """The runtime compiled once, without the sanitizer, per compiler and runtime version;
    partially linked into one object whose code and data sections are renamed."""
    flags = BASE_FLAGS + RUNTIME_FLAGS
    key = _digest([SHIM.read_bytes(), *_runtime_bytes(), compiler_version(cxx), *flags,
                   *RUNTIME_SECTIONS.items()])
    target = cache_dir() / f"runtime-{key}.o"

    def build(tmp: Path, out: Path):
        objs = []
        for src in RUNTIME:
            if src.suffix == ".cpp":
                objs.append(str(tmp / f"{src.stem}.o"))
                _run([cxx, *flags, "-I", str(HERE), "-c", str(src), "-o", objs[-1]],
                     f"compiling the emulator runtime ({src.name})")
        merged = tmp / "merged.o"
        _run([cxx, "-r", "-nostdlib", "-o", str(merged), *objs], "linking the emulator runtime")
        objcopy = shutil.which("objcopy") or "objcopy"
        renames = [a for old, new in RUNTIME_SECTIONS.items()
                   for a in ("--rename-section", f"{old}={new}")]
        _run([objcopy, *renames, str(merged), str(out)], "naming the runtime's sections")

    return locked_build(target, build)


def mode_flags(mode: str) -> list[str]:
    """The kernel's own flags in a mode: counted adds the memory hooks and the alignment check."""
    return COUNT_FLAGS + ALIGN_FLAGS if mode == "counted" else []


def module_path(code: str, name: str, expressions: list[str], options, mode: str) -> Path:
    """Where the library for this source, kernels, options and mode is (or will be) cached."""
    cxx = compiler()
    flags = BASE_FLAGS + host_flags(options) + mode_flags(mode)
    key = _digest([_source(code, name, expressions), SHIM.read_bytes(), *_runtime_bytes(),
                   *[f.read_bytes() for f in (HERE / "build.py", HERE / "rewrite.py")],
                   compiler_version(cxx), *flags, *_headers(options),
                   *_headers(["-I", str(INCLUDE)])])
    stem = re.sub(r"[^\w.-]", "_", name)[:40]
    return cache_dir() / f"{stem}-{mode}-{key}.so"


def _source(code: str, name: str, expressions: list[str]) -> str:
    return f'#line 1 "{name}"\n' + rewrite_source(code) + launcher_code(expressions)


def build_module(code: str, name: str, expressions: list[str], options, mode: str) -> Path:
    """Compile one kernel file for one mode; returns the path of the cached shared library."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    cxx = compiler()
    flags = BASE_FLAGS + host_flags(options) + mode_flags(mode)
    target = module_path(code, name, expressions, options, mode)
    runtime = runtime_object(cxx)

    def build(tmp: Path, out: Path):
        src, obj = tmp / "kernel.cpp", tmp / "kernel.o"
        src.write_text(_source(code, name, expressions))
        includes = _rewritten_includes(options, tmp)
        # the rewritten copies of the headers come first, before the original -I folders
        _run([cxx, *includes, *flags, "-I", str(INCLUDE), "-include", str(SHIM), "-c", str(src),
              "-o", str(obj)],
             f"compiling {name} for the CPU emulator ({mode})")
        _run([cxx, "-shared", "-pthread", "-o", str(out), str(obj), str(runtime),
              "-Wl,-Bsymbolic", "-Wl,-z,defs", "-lm"], f"linking {name}")

    return locked_build(target, build, complete_elf)


def source_line(library: Path, pc_offset: int, name: str = "") -> tuple[str | None, int | None]:
    """File and line of an instruction in a built module (addr2line; None where unavailable).
    The kernel file is compiled as kernel.cpp under `#line 1 "<name>"`; addr2line sometimes
    reports the compiled file's name for it, so that name is mapped back to `name`. An
    instruction of the emulator's own headers inlined into the kernel (a shuffle's body in
    shim.h) is reported at the kernel's line that called it: the innermost frame of the inline
    chain (addr2line -i) that is not one of those headers."""
    tool = shutil.which("addr2line")
    if not tool or not pc_offset:
        return None, None
    proc = subprocess.run([tool, "-i", "-e", str(library), hex(pc_offset - 1)],
                          capture_output=True, text=True)
    frames = [m for m in (re.match(r"(.*):(\d+)", ln.split(" (discriminator")[0])
                          for ln in proc.stdout.strip().splitlines())
              if m and m.group(1) != "??"]
    if not frames:
        return None, None
    own = [m for m in frames if not _emulator_header(m.group(1))]
    m = (own or frames)[0]
    file = os.path.basename(m.group(1))
    return (name or file) if file == "kernel.cpp" else file, int(m.group(2))


def _emulator_header(path: str) -> bool:
    """shim.h or a header of include/: code of the emulator, not of the kernel. Matched by the
    names of the file and its folders, not by the full path: a cached module may have been
    built from another checkout, whose paths its debug information keeps."""
    p = Path(path)
    is_shim = p.name == SHIM.name and p.parent.name == HERE.name
    in_include = p.parent.name == INCLUDE.name and p.parent.parent.name == HERE.name
    return is_shim or in_include
