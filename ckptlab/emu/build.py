"""Turn a .cu file into a shared library the emulator can load: rewrite what host C++ cannot
say (dynamic shared memory), append one launcher per kernel, compile with g++ (two variants:
"fast" plain, "counted" with GCC's memory-access hooks), link it with the runtime
(scheduler.cpp, memory.cpp, launch.cpp) and cache the result.

The cache lives in $CKPTLAB_CACHE_DIR, else $XDG_CACHE_HOME/ckptlab/emu, else
~/.cache/ckptlab/emu, keyed by a hash of everything that affects the binary: the source, the
headers it may include, shim.h, the runtime's sources, the flags and the compiler's version.
Two processes building the same module at once take a file lock; the loser finds the winner's
library.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIM = HERE / "shim.h"
# CUDA's headers the emulator provides itself (cuda_fp16.h, cuda_bf16.h, mma.h), searched after
# the kernel's own -I folders
INCLUDE = HERE / "include"
RUNTIME = [HERE / "abi.h", HERE / "runtime.h", HERE / "scheduler.cpp", HERE / "memory.cpp",
           HERE / "launch.cpp"]

BASE_FLAGS = [
    "-std=c++20", "-O2", "-g", "-fPIC", "-fvisibility=hidden",
    "-fno-strict-aliasing",        # CUDA code reinterprets float* as float4* freely
    "-fno-exceptions",
    "-fno-threadsafe-statics",     # one OS thread runs every fiber: no guards needed
    "-fstack-clash-protection",    # big frames touch the guard page first: a clean overflow
    "-Wno-unused-parameter", "-Wno-unused-variable",
]
# GCC calls __tsan_{read,write}{1,2,4,8,16} before every access; memory.cpp defines them. No
# TSan runtime is linked. (ThreadSanitizer's instrumentation, not AddressSanitizer's: ASan skips
# the store of `x[i] += v` after checking the load, so that write would go uncounted.)
COUNT_FLAGS = [
    "-fsanitize=thread",
    "--param", "tsan-instrument-func-entry-exit=0",
    "--param", "tsan-distinguish-volatile=0",
]
MODES = ("counted", "fast")


class EmuError(RuntimeError):
    """A fault inside an emulated kernel, or a launch the emulator refuses.

    Attributes (None where unknown): kind, kernel, block, thread, file, line.
    """

    def __init__(self, message, *, kind=None, kernel=None, block=None, thread=None, file=None,
                 line=None):
        super().__init__(message)
        self.kind, self.kernel, self.block, self.thread = kind, kernel, block, thread
        self.file, self.line = file, line


class EmuCompileError(EmuError):
    """The C++ compiler rejected a kernel file (the message carries its output) or is missing."""


def cache_dir() -> Path:
    root = os.environ.get("CKPTLAB_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "ckptlab" / "emu"


def compiler() -> str:
    """Path of the C++ compiler ($CXX or g++), or a clear error saying what to install."""
    name = os.environ.get("CXX", "g++")
    path = shutil.which(name)
    if path is None:
        raise EmuCompileError(
            f"ckptlab's CPU emulator needs a C++20 compiler to build the kernels, and {name!r} "
            "is not on the PATH. Install GCC >= 10: `sudo apt install g++` (Debian/Ubuntu), "
            "`sudo dnf install gcc-c++` (Fedora), or set CXX to a g++ you have."
        )
    return path


_versions: dict = {}


def compiler_version(cxx: str) -> str:
    if cxx not in _versions:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True)
        _versions[cxx] = out.stdout.splitlines()[0] if out.stdout else cxx
    return _versions[cxx]


# `extern __shared__ float smem[];` -> a pointer into the launch's dynamic shared buffer.
_DYN_SHARED = re.compile(
    r"extern\s+__shared__\s+((?:__align__\s*\(\s*\d+\s*\)\s*)?)([A-Za-z_][\w:<>\s]*?)\s+"
    r"([A-Za-z_]\w*)\s*\[\s*\]\s*;"
)


# `__shared__ float tile[16][17], row[16];` -> a place in the module's static shared arena
# (memory.cpp: emu_shared_alloc, once per declaration) and a reference to it through an opaque
# pointer. Why the reference: GCC's hooks skip accesses to a static array at a constant index
# (`tile[0][3]`, a scalar), which would leave them uncounted and outside the race check.
_STATIC_SHARED = re.compile(
    r"(?<![\w])__shared__\s+(?P<align>__align__\s*\(\s*\d+\s*\)\s+)?"
    r"(?P<type>(?:(?:const|unsigned|signed|long|short|typename)\s+)*[A-Za-z_][\w:]*"
    r"(?:\s*<[^;<>]*>)?)\s+(?P<decls>[^;{}()]+);"
)
_DECLARATOR = re.compile(
    r"\s*(?:__align__\s*\(\s*(?P<align>\d+)\s*\)\s*)?(?P<name>[A-Za-z_]\w*)\s*"
    r"(?P<dims>(?:\[[^\]]+\]\s*)*)$"
)


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += {"[": 1, "(": 1, "<": 1, "]": -1, ")": -1, ">": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def _static_shared(m: re.Match) -> str:
    align = re.findall(r"\d+", m.group("align") or "")
    out = []
    for decl in _split_top(m.group("decls")):
        d = _DECLARATOR.match(decl)
        if not d:
            return m.group(0)  # not a plain declaration: leave it to the __shared__ macro
        a = d.group("align") or (align[0] if align else "16")
        name, dims, ty = d.group("name"), d.group("dims").strip(), m.group("type")
        p = f"emu_shared_{name}"
        out.append(f"static char* const {p} = static_cast<char*>(emu_shared_alloc(sizeof({ty}"
                   f"{dims}), alignof({ty}) > {a} ? alignof({ty}) : {a})); {ty} (&{name}){dims}"
                   f" = *emu_launder(reinterpret_cast<{ty}(*){dims}>({p}));")
    return " ".join(out)


def rewrite_source(code: str) -> str:
    """What host C++ cannot express, rewritten on one line each (line numbers are kept)."""
    code = _DYN_SHARED.sub(
        lambda m: f"{m.group(2)}* {m.group(3)} = reinterpret_cast<{m.group(2)}*>"
        "(emu_dynamic_shared);",
        code,
    )
    return _STATIC_SHARED.sub(_static_shared, code)


def launcher_code(expressions: list[str]) -> str:
    """One exported launcher and signature function per kernel (expression)."""
    lines = ["", "// ---- appended by ckptlab.emu: one launcher per kernel ----"]
    for i, expr in enumerate(expressions):
        lines.append(f"EMU_EXPORT EMU_UNCOUNTED void emu_launch_{i}(void** a) "
                     f"{{ emu_invoke(&{expr}, a); }}")
        lines.append(
            f"EMU_EXPORT const char* emu_sig_{i}() {{ return emu_signature(&{expr}); }}"
        )
    return "\n".join(lines) + "\n"


def _include_dirs(options) -> list[str]:
    dirs, it = [], iter(options)
    for opt in it:
        if opt == "-I":
            dirs.append(next(it, ""))
        elif opt.startswith("-I"):
            dirs.append(opt[2:])
    return [d for d in dirs if d]


def host_flags(options) -> list[str]:
    """Keep the options that mean the same to g++ (-I, -D, -U); NVRTC-only ones are dropped."""
    keep, it = [], iter(options)
    for opt in it:
        if opt in ("-I", "-D", "-U"):
            keep += [opt, next(it, "")]
        elif opt[:2] in ("-I", "-D", "-U"):
            keep.append(opt)
    return keep


def _digest(parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def _headers(options) -> list[bytes]:
    out = []
    for d in _include_dirs(options):
        p = Path(d)
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                if f.suffix in (".h", ".cuh", ".hpp", ".inc") and f.is_file():
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
            if f.suffix in (".h", ".cuh", ".hpp", ".inc") and f.is_file():
                target = dst / f.relative_to(src)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(f"#line 1 \"{f.name}\"\n" + rewrite_source(f.read_text()))
        flags += ["-I", str(dst)]
    return flags


def _run(cmd, what):
    env = dict(os.environ, LC_ALL="C", LANG="C")  # plain ASCII quotes in the messages
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise EmuCompileError(f"{what} failed:\n$ {' '.join(cmd)}\n{proc.stderr.strip()}")


def _locked_build(target: Path, build):
    """Build `target` once, even when several processes race for it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        return target
    with open(str(target) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not target.exists():
                with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                    out = Path(tmp) / target.name
                    build(Path(tmp), out)
                    os.replace(out, target)  # atomic: others see all of it or none
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return target


def _runtime_bytes() -> list[bytes]:
    return [f.read_bytes() for f in RUNTIME]


def runtime_object(cxx: str) -> Path:
    """The runtime (scheduler.cpp, memory.cpp, launch.cpp) compiled once, without the
    sanitizer, per compiler and runtime version; partially linked into one object."""
    key = _digest([SHIM.read_bytes(), *_runtime_bytes(), compiler_version(cxx), *BASE_FLAGS])
    target = cache_dir() / f"runtime-{key}.o"

    def build(tmp: Path, out: Path):
        objs = []
        for src in RUNTIME:
            if src.suffix == ".cpp":
                objs.append(str(tmp / f"{src.stem}.o"))
                _run([cxx, *BASE_FLAGS, "-I", str(HERE), "-c", str(src), "-o", objs[-1]],
                     f"compiling the emulator runtime ({src.name})")
        _run([cxx, "-r", "-nostdlib", "-o", str(out), *objs], "linking the emulator runtime")

    return _locked_build(target, build)


def build_module(code: str, name: str, expressions: list[str], options, mode: str) -> Path:
    """Compile one kernel file for one mode; returns the path of the cached shared library."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    cxx = compiler()
    source = f'#line 1 "{name}"\n' + rewrite_source(code) + launcher_code(expressions)
    flags = BASE_FLAGS + host_flags(options) + (COUNT_FLAGS if mode == "counted" else [])
    key = _digest([source, SHIM.read_bytes(), *_runtime_bytes(), Path(__file__).read_bytes(),
                   compiler_version(cxx), *flags, *_headers(options),
                   *_headers(["-I", str(INCLUDE)])])
    stem = re.sub(r"[^\w.-]", "_", name)[:40]
    target = cache_dir() / f"{stem}-{mode}-{key}.so"
    runtime = runtime_object(cxx)

    def build(tmp: Path, out: Path):
        src, obj = tmp / "kernel.cpp", tmp / "kernel.o"
        src.write_text(source)
        includes = _rewritten_includes(options, tmp)
        # the rewritten copies of the headers come first, before the original -I folders
        _run([cxx, *includes, *flags, "-I", str(INCLUDE), "-include", str(SHIM), "-c", str(src),
              "-o", str(obj)],
             f"compiling {name} for the CPU emulator ({mode})")
        _run([cxx, "-shared", "-o", str(out), str(obj), str(runtime),
              "-Wl,-Bsymbolic", "-Wl,-z,defs", "-lm"], f"linking {name}")

    return _locked_build(target, build)


def source_line(library: Path, pc_offset: int, name: str = "") -> tuple[str | None, int | None]:
    """File and line of an instruction in a built module (addr2line; None where unavailable).
    The kernel file is compiled as kernel.cpp under `#line 1 "<name>"`; addr2line sometimes
    reports the compiled file's name for it, so that name is mapped back to `name`."""
    tool = shutil.which("addr2line")
    if not tool or not pc_offset:
        return None, None
    proc = subprocess.run([tool, "-e", str(library), hex(pc_offset - 1)],
                          capture_output=True, text=True)
    text = proc.stdout.strip().splitlines()[0] if proc.stdout.strip() else ""
    m = re.match(r"(.*):(\d+)", text)
    if not m or m.group(1) == "??":
        return None, None
    file = os.path.basename(m.group(1))
    return (name or file) if file == "kernel.cpp" else file, int(m.group(2))
