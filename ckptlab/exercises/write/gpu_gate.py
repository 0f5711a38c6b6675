"""Before the emulator builds a learner's kernel file: refuse what a GPU would refuse.

On the emulator a kernel is host C++ run inside the check's process, so `exit(0)` in a kernel
would end the check and `system(...)` would run a shell. A GPU build refuses both. So the file is
first read by ckptlab's own rules (gpu_rules: host functions, host headers, inline assembly,
code run at load time) and compiled by NVRTC, the CUDA compiler the labs use on a GPU, where it
is installed (one instantiation of each template kernel, to a cubin, so that ptxas also refuses
a call to a function no device has). Either one refusing makes the report "does not build",
naming the learner's line, the reason and which of the two refused. A file NVRTC accepted is
remembered (in the emulator's cache folder, by a hash of the file, the headers and NVRTC's
version), so a check run again on it pays nothing.

The exercise's kernels must also be in the file, under the names the lab's launch wrappers ask
for: an empty file, another exercise's file or a renamed kernel get one line that says so.
"""

from __future__ import annotations

import hashlib
import re
import threading
from pathlib import Path

from ckptlab import device, emu
from ckptlab.emu.signature import kernel_names, strip_comments
from ckptlab.exercises.write import feedback, gpu_rules
from ckptlab.exercises.write.check import NO_BUILD, Report

ARCH = "sm_90"  # any arch of ckptlab.kernels.archs runs every exercise; this one is the newest
NVRTC_LIMIT_S = 60.0  # the largest exercise file compiles in about 1.5 s on one core
_GLOBAL = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+"
                     r"(?:__launch_bounds__\s*\([^)]*\)\s*)?([A-Za-z_]\w*)\s*\(")


def kernels_in(text: str) -> tuple[list[str], list[str]]:
    """(the `extern "C"` kernels, every __global__ function) named in `text`."""
    return kernel_names(text), _GLOBAL.findall(strip_comments(text))


def missing_kernel(ex, text: str, shown: str) -> Report | None:
    """A one-line report when a kernel the exercise launches is not in the learner's file (or
    is there without the `extern "C"` its launch looks it up by), else None."""
    shipped = (device.KERNELS_DIR / ex.kernel).read_text()
    want_c, want_all = kernels_in(shipped)
    have_c, have_all = kernels_in(text)
    found = ", ".join(have_all) or "none"
    for name in want_all:
        if name not in have_all:
            return Report(ex.name, NO_BUILD, [
                f"{NO_BUILD}: no kernel {name} in {shown}; the exercise launches "
                f"{', '.join(want_all)} (kernels in the file: {found}). Is it {ex.name}'s file?"
                f" `python -m ckptlab exercise reset {ex.name}` puts it back as shipped"])
        if name in want_c and name not in have_c:
            return Report(ex.name, NO_BUILD, [
                f'{NO_BUILD}: {name} in {shown} is not extern "C": the launch finds it by its C '
                f'name; declare it `extern "C" __global__ void {name}(...)` as shipped'])
    return None


def _expressions(ex) -> tuple:
    """One instantiation of each template kernel the labs launch from the exercise's file."""
    from ckptlab.kernels import archs

    first: dict = {}
    for e in archs.to_compile(ex.kernel, ARCH, None):
        first.setdefault(e.split("<")[0], e)
    return tuple(first.values())


def _installed() -> str:
    """The versions of the packages NVRTC comes from, read without importing them."""
    from importlib import metadata

    found = []
    for dist in ("nvidia-cuda-nvrtc-cu12", "cuda-bindings", "cupy-cuda12x", "cupy"):
        try:
            found.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            pass
    return ", ".join(found)


def _ok_path(text: str, name: str, label: str, options, expressions) -> Path | None:
    """Where NVRTC's acceptance of this file is remembered: in the emulator's cache folder,
    held to the same rules (yours, mode 700, no one else can write above it); None where it
    is not safe, and then nothing is remembered or believed."""
    from ckptlab.emu.cache import cache_dir, secure_dir

    parts = [text, name, label, device.headers_hash(), *options, *expressions,
             Path(__file__).read_text(), Path(gpu_rules.__file__).read_text()]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]
    try:
        return secure_dir(cache_dir() / "gpu-accepted") / key
    except (emu.EmuCompileError, OSError):
        return None


def _compiler():
    """(label, compile function (source, name, options, expressions) -> (ok, log), the arch
    option): NVRTC through ctypes to PTX where its library loads (milliseconds), else through
    ckptlab.kernels.nvrtc's binding to a cubin (ptxas then finds the missing functions); None
    where NVRTC is not installed."""
    from ckptlab.kernels import nvrtc as bindings
    from ckptlab.kernels import nvrtc_lib

    try:
        _, version = nvrtc_lib.load()
    except OSError:
        try:
            _, version, compile_fn = bindings._nvrtc()
        except bindings.CompilerNotFound:
            return None
        return f"NVRTC {version}", compile_fn, f"-arch={ARCH}"

    def to_ptx(source, name, options, expressions):
        ok, log, ptx = nvrtc_lib.compile_ptx(source, name, options, expressions)
        missing = nvrtc_lib.externs(ptx) if ok else []
        said = "".join(f"ptxas fatal   : Unresolved extern function '{f}'\n" for f in missing)
        return ok and not missing, log + said

    return f"NVRTC {version}", to_ptx, f"-arch=compute_{ARCH[3:]}"


def nvrtc(ex, text: str, shown: str, limit_s: float = NVRTC_LIMIT_S):
    """(NVRTC's label, None if it accepts the file else its log); None where NVRTC cannot be
    loaded. A compile still running after `limit_s` is a refusal that says so."""
    from ckptlab.kernels import nvrtc as bindings

    options = ["-std=c++17", f"-I{device.KERNELS_DIR}", *bindings.cuda_include_options()]
    name = Path(shown).name
    expressions = _expressions(ex)
    ok_path = _ok_path(text, name, _installed(), options, expressions)
    if ok_path is not None and ok_path.is_file():
        return "NVRTC", None  # accepted before
    found = _compiler()
    if found is None:
        return None
    label, compile_fn, arch = found
    result: list = []

    def work():
        try:
            result.append(compile_fn(text, name, [arch, *options], expressions))
        except Exception as e:  # a binding's own error: a refusal with its message
            result.append((False, f"{type(e).__name__}: {e}"))

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(limit_s)
    if not result:
        return label, f"{name}(1): error: the compile did not finish in {limit_s:.0f} s"
    ok, log = result[0]
    if ok:
        try:
            if ok_path is not None:
                ok_path.touch()
        except OSError:
            pass  # not remembered: the next check compiles again
        return label, None
    return label, log


def _ptxas_lines(log: str, shown: str, text: str) -> list[str]:
    """ptxas' refusals carry no line: find the learner's call of each missing function."""
    out = []
    for fn in re.findall(r"Unresolved extern function '([^']+)'", log):
        out.append(f"  {fn}() exists on no GPU (ptxas: unresolved extern function)")
        code = gpu_rules.blank(text)
        if m := re.search(rf"\b{re.escape(fn)}\s*\(", code):
            out += feedback.source_window(text, code.count("\n", 0, m.start()) + 1, 0, 0)
    if not out:
        out = ["  " + ln.strip() for ln in log.strip().splitlines()[:4]]
    return out


def gate(ex, text: str, shown: str, use_nvrtc: bool = True):
    """(the "does not build" report, None) for a file ckptlab's rules refuse or that lacks the
    exercise's kernels; else (None, `later`): NVRTC compiles the file meanwhile (in a thread,
    while g++ builds it for the emulator), and later() is its report or None, for the moment
    the emulator has built the file and has not loaded it yet. NVRTC's refusal waits for g++:
    most are plain mistakes (a typo) g++ refuses too, which the emulator's build then tells as
    usual; it stands only if g++ builds the file."""
    missing = missing_kernel(ex, text, shown)
    if missing is not None:
        return missing, None
    mine = gpu_rules.refusals(text)
    if mine:
        return _refusal(ex, text, shown, mine, nvrtc(ex, text, shown) if use_nvrtc else None), \
            None
    if not use_nvrtc:
        return None, None
    said: list = []
    worker = threading.Thread(target=lambda: said.append(nvrtc(ex, text, shown)), daemon=True)
    worker.start()

    def later() -> Report | None:
        worker.join()
        if not said or said[0] is None or said[0][1] is None:
            return None
        return _refusal(ex, text, shown, [], said[0])

    return None, later


def _refusal(ex, text: str, shown: str, mine: list, said) -> Report:
    lines = [f"{NO_BUILD}: {ex.name}: a GPU would not build it, so the emulator does not run it"
             " (there a kernel is host code run in the check's own process)"]
    for r in mine[:5]:
        lines.append(f"  {shown}:{r.line}: {r.reason}")
        lines += feedback.source_window(text, r.line, 0, 0)
    if len(mine) > 5:
        lines.append(f"  ({len(mine) - 5} more)")
    if said is None:
        lines.append("refused by ckptlab's GPU rules (NVRTC, the GPU's compiler, is not "
                     "installed here to say it too)")
    elif said[1] is None:
        lines.append(f"refused by ckptlab's GPU rules ({said[0]} compiles it, but the emulator "
                     "would run it as host code)")
    else:
        label, log = said
        told = feedback.compile_report(log, shown, text)
        if told[0].startswith("the kernel does not build"):
            told = _ptxas_lines(log, shown, text)
        else:
            told[0] = told[0].replace("your kernel does not build: ", "  ")
        if mine:  # the lines are shown above
            told = [ln for ln in told if not re.match(r"\s+\d+ [ >] |\s+\^", ln)]
        who = f"ckptlab's GPU rules and {label}" if mine else label
        lines += [f"refused by {who}; {label} says:", *told]
    return Report(ex.name, NO_BUILD, lines)
