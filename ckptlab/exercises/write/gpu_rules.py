"""What a GPU build refuses in a learner's kernel file, found by reading its text, with no CUDA
compiler: the check runs it before the emulator builds the file.

On the emulator a kernel is host C++ compiled by g++ and run inside the checking process, with
the C library in reach (the emulator's shim includes <cstdlib> and <cstdio>). On a GPU, NVRTC
compiles device code only: it has no C or C++ library headers, refuses every host function, and
ptxas refuses calls to functions that do not exist on the device and any assembly that is not
PTX. These rules refuse the same things by name, each with the learner's line and the reason:

    includes   only kernels/*.cuh ("common.cuh") and the CUDA headers the emulator provides
               (<cuda_fp16.h>, <cuda_bf16.h>, <mma.h>); <stdio.h>, <cstdlib>, <fstream>,
               <thread>... are host headers (printf needs none)
    calls      host functions: system, exit, abort, fork, popen, fopen, open, write, execve,
               dlopen... (printf, malloc and the math functions exist on the device)
    asm        inline assembly (on the emulator it is x86; a GPU takes only PTX)
    globals    an object at namespace scope whose constructor or initializer would run code
               when the emulator loads the file, and __attribute__((constructor))

Comments and string literals are blanked first: `// exit(0)` or "fopen" in a string is not a
call. What the preprocessor could assemble from pieces (`ex ## it`) these rules do not see;
NVRTC, where installed, compiles the file as a GPU would and sees everything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ckptlab import device

EMU_INCLUDE = Path(__file__).resolve().parents[2] / "emu" / "include"

# Host functions no device has; any use of one of these names is refused.
HOST_ONLY = frozenset("""
system exit _exit _Exit quick_exit abort atexit at_quick_exit on_exit fork vfork clone
popen pclose fopen freopen fdopen tmpfile fclose fread fwrite fputs fputc fgets fgetc fscanf
fprintf fflush puts putchar getchar gets scanf perror execve execv execvp execvpe execl execlp
execle fexecve posix_spawn posix_spawnp dlopen dlsym dlclose syscall mmap munmap mprotect
ptrace getenv setenv unsetenv putenv pthread_create pthread_kill creat openat unlinkat
truncate ftruncate chmod chown symlink link mkfifo setuid setgid longjmp setjmp
cout cerr clog cin ofstream ifstream fstream filebuf jthread filesystem
""".split())
# Names a kernel may also use for a variable (`int read = ...`): refused only when called.
HOST_CALLS = frozenset("""
open close read write unlink remove rename mkdir rmdir chdir kill raise signal sigaction
socket connect bind listen accept send recv sendto recvfrom sleep usleep nanosleep alarm
pipe dup dup2 wait waitpid time rand srand thread async
""".split())
ASM = frozenset({"asm", "__asm__", "__asm"})
QUALIFIERS = frozenset("""static extern const constexpr volatile inline thread_local
__device__ __constant__ __shared__ __managed__ __host__ __forceinline__ __restrict__
unsigned signed long short""".split())
NOT_CALLS = frozenset("sizeof alignof decltype static_cast reinterpret_cast const_cast "
                      "dynamic_cast noexcept __align__ __launch_bounds__ alignas".split())


@dataclass(frozen=True)
class Refusal:
    """One thing a GPU build refuses: the learner's line (1-based) and why."""

    line: int
    reason: str


def blank(text: str, strings: bool = True) -> str:
    """`text` with comments (and, with `strings`, the inside of string and character literals)
    replaced by spaces; newlines and every other offset stay where they were."""
    out, i, n = list(text), 0, len(text)

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            wipe(i, j)
            i = j
        elif c in "\"'" and not (c == "'" and i and (text[i - 1].isalnum())):  # 1'000 digit sep
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            if strings:
                wipe(i + 1, min(j, n))
            i = j + 1
        else:
            i += 1
    return "".join(out)


def _line(code: str, pos: int) -> int:
    return code.count("\n", 0, pos) + 1


def includes(text: str, kernels_dir: Path | None = None) -> list[Refusal]:
    """Every #include a GPU build cannot find, with why."""
    kernels_dir = Path(kernels_dir or device.KERNELS_DIR)
    cuda = sorted(p.name for p in EMU_INCLUDE.glob("*.h"))
    out = []
    code = blank(text, strings=False)
    for m in re.finditer(r"^[ \t]*#[ \t]*(include_next|include|import)\b[ \t]*(.*)$", code,
                         flags=re.M):
        what, arg, line = m[1], m[2].strip(), _line(code, m.start())
        if what != "include":
            out.append(Refusal(line, f"#{what} is not a directive a GPU build knows"))
        elif q := re.fullmatch(r'"([^"]+)"', arg):
            name = q[1]
            if "/" in name or "\\" in name or not (kernels_dir / name).is_file():
                own = ", ".join(sorted(p.name for p in kernels_dir.glob("*.cuh")))
                out.append(Refusal(line, f'#include "{name}": a GPU build of this file finds '
                                   f"only the kernels' own headers ({own})"))
        elif a := re.fullmatch(r"<([^>]+)>", arg):
            if a[1] not in cuda:
                out.append(Refusal(line, f"#include <{a[1]}> is a host header: a GPU build "
                                   f"(NVRTC) has no C or C++ library headers (printf, expf and "
                                   f"the other device functions need none; CUDA's own headers "
                                   f"here: {', '.join(cuda)})"))
        else:
            out.append(Refusal(line, f"#include {arg}: an include computed by a macro"))
    return out


def _identifiers(code: str):
    for m in re.finditer(r"[A-Za-z_]\w*", code):
        yield m


def names(text: str) -> list[Refusal]:
    """Host functions, host I/O objects and inline assembly, by name."""
    code = blank(text)
    code = re.sub(r"^[ \t]*#[^\n]*", lambda m: " " * len(m[0]), code, flags=re.M)
    out = []
    for m in _identifiers(code):
        word, before = m[0], code[:m.start()].rstrip()
        after = code[m.end():].lstrip()
        member = before.endswith((".", "->")) and not before.endswith("::")
        if word in ASM:
            out.append(Refusal(_line(code, m.start()), f"`{word}`: inline assembly; on the "
                               "emulator it would run as x86 host code, and a GPU takes only PTX"
                               " (these kernels need none)"))
        elif member:
            continue
        elif word in HOST_ONLY or (word in HOST_CALLS and (
                after.startswith("(") or re.search(r"\bstd\s*::$", before))):
            kind = "a host function" if after.startswith("(") else "host code"
            out.append(Refusal(_line(code, m.start()), f"`{word}` is {kind}: no GPU has it "
                               "(on the emulator it would run in the checking process)"))
        elif word == "__attribute__" and re.match(r"\(\(\s*(constructor|destructor)", after):
            out.append(Refusal(_line(code, m.start()), "__attribute__((constructor)): code "
                               "that runs when the file is loaded, outside any kernel"))
    return out


def _top_level(code: str):
    """(start offset, statement text) of each statement at namespace scope, the bodies of
    functions and classes elided to `{}`; a class body is kept as ' {class} '."""
    stack, stmt, start, i, n = [], [], 0, 0, len(code)
    while i < n:
        c = code[i]
        if not stack or stack[-1] == "ns":
            if c == "{":
                head = "".join(stmt)
                if re.search(r'\bnamespace\b[^;{}]*$|\bextern\s*"\s*"\s*$', head):
                    stack.append("ns")
                    stmt, start = [], i + 1
                else:
                    kind = "class" if re.search(
                        r"\b(struct|class|union|enum)\b[^;()=]*(\([^)]*\)[^;()=]*)?$", head) \
                        else "body"
                    depth, j = 1, i + 1
                    while j < n and depth:
                        depth += {"{": 1, "}": -1}.get(code[j], 0)
                        j += 1
                    stmt.append(" {class} " if kind == "class" else " {} ")
                    i = j
                    if kind == "body" and not code[j:].lstrip().startswith((";", ",")):
                        yield start, "".join(stmt)  # a function's definition ends here
                        stmt, start = [], j
                    continue
            elif c == "}" and stack:
                stack.pop()
                stmt, start = [], i + 1
            elif c == ";":
                yield start, "".join(stmt)
                stmt, start = [], i + 1
            else:
                stmt.append(c)
        i += 1


def _classes(code: str) -> set[str]:
    return set(re.findall(r"\b(?:struct|class|union)\s+(?:__align__\s*\(\s*\d+\s*\)\s*)?"
                          r"([A-Za-z_]\w*)", code))


def globals_(text: str) -> list[Refusal]:
    """Objects at namespace scope that would run code when the emulator loads the file: of a
    class this file defines (its constructor), declared right after a class body, or
    initialized by a call."""
    code = blank(text)
    code = re.sub(r"^[ \t]*#[^\n]*", lambda m: " " * len(m[0]), code, flags=re.M)
    classes, out = _classes(code), []
    for start, stmt in _top_level(code):
        s = stmt.strip()
        first = re.match(r"[A-Za-z_]\w*", s)
        if not s or (first and first[0] in ("typedef", "using", "template", "static_assert",
                                             "friend", "namespace")):
            continue
        line = _line(code, start + len(stmt) - len(stmt.lstrip()))
        if " {class} " in stmt:
            tail = stmt.split(" {class} ", 1)[1].strip()
            if re.match(r"[*&]*\s*[A-Za-z_]", tail):
                out.append(Refusal(line, "an object defined at namespace scope after its class:"
                                   " its constructor would run when the file is loaded"))
            continue
        words = [w for w in re.findall(r"[A-Za-z_]\w*|\S", s.split("=")[0])]
        types = [w for w in words if w not in QUALIFIERS]
        if len(types) >= 2 and types[0] in classes and re.match(r"[A-Za-z_]", types[1]):
            rest = s.split(types[1], 1)[1].lstrip() if types[1] in s else ""
            params = re.match(r"\(\s*([A-Za-z_]\w*|\)|\.\.\.)", rest)
            function = params and (params[1] in (")", "...") or params[1] in QUALIFIERS or
                                   params[1] in classes or params[1] in
                                   ("int", "float", "double", "char", "bool", "void", "size_t"))
            if not function:
                out.append(Refusal(line, f"a global object of class {types[0]}: its constructor"
                                   " would run when the file is loaded, outside any kernel"))
                continue
        if "=" in s and "constexpr" not in words:
            init = s.split("=", 1)[1]
            call = next((m for m in re.finditer(r"([A-Za-z_]\w*|\])\s*\(", init)
                         if m[1] not in NOT_CALLS), None)
            if call or re.search(r"\)\s*\(", init):
                out.append(Refusal(line, "a global initialized by a call: it would run when "
                                   "the file is loaded, outside any kernel (a GPU allows only "
                                   "constant initializers)"))
    return out


def refusals(text: str, kernels_dir: Path | None = None) -> list[Refusal]:
    """Everything these rules refuse in `text`, in line order."""
    found = includes(text, kernels_dir) + names(text) + globals_(text)
    return sorted(set(found), key=lambda r: (r.line, r.reason))
