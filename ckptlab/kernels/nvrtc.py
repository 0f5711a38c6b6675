"""NVIDIA's real compiler as a check, no GPU needed: compile kernels/*.cu for an arch (sm_75
... sm_90, ckptlab.kernels.archs) and read ptxas' `-v` report, one record per kernel
(registers, static shared memory, spills, stack, barriers, constant banks; the report is read
in ckptlab.kernels.ptxas_log, the records kept on disk by ckptlab.kernels.ptxas_cache).

The emulator runs the kernels; only ptxas says what they cost on the chip. A spill or a jump in
registers shows up here first. Two backends: NVRTC (the compiler as a library, from the pip
wheel nvidia-cuda-nvrtc-cu12, reached through cuda.bindings or CuPy's binding) and nvcc (when it
is on the PATH). `python -m ckptlab kernels` prints the table (ckptlab.cli.kernels_report).
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from ckptlab.device import KERNELS_DIR
from ckptlab.kernels import archs as arch_support
from ckptlab.kernels import ptxas_cache
from ckptlab.kernels.ptxas_log import demangle, parse_ptxas_log, short_name

ARCHS = tuple(arch_support.ARCHS)  # sm_75 (T4) ... sm_90 (H100)
BACKENDS = ("nvrtc", "nvcc")
NVRTC_BINDINGS = ("cuda.bindings.nvrtc", "cupy_backends.cuda.libs.nvrtc")  # tried in this order
INSTALL_HINT = (
    "pip install nvidia-cuda-nvrtc-cu12 (NVRTC itself), plus a Python binding for it: "
    "cupy-cuda12x (in requirements.txt) or cuda-bindings; or put nvcc (CUDA toolkit) on the PATH"
)

HEADERS_HINT = (
    "\n(NVRTC needs CUDA's headers: set CUDA_PATH or pip install nvidia-cuda-runtime-cu12)"
)


class CompilerNotFound(RuntimeError):
    """Neither NVRTC nor nvcc (or not the one asked for) can be used on this machine."""


ArchUnsupported = arch_support.ArchUnsupported  # refused before compiling, with the reason


class CompileError(RuntimeError):
    """The compiler rejected a file; `.log` holds its full output, which the message quotes."""

    def __init__(self, file, arch, backend, log):
        self.file, self.arch, self.backend, self.log = str(file), arch, backend, log
        super().__init__(f"{backend} could not compile {file} for {arch}:\n{log.strip()}")


# ---------------------------------------------------------------- the two compilers


@functools.lru_cache(maxsize=None)
def _nvrtc():
    """(binding name, NVRTC version, compile function) for the first binding whose NVRTC loads."""
    reasons = []
    for name in NVRTC_BINDINGS:
        try:
            module = importlib.import_module(name)
            if name.startswith("cuda."):
                err, major, minor = module.nvrtcVersion()
                _ok(module, err, "nvrtcVersion")
                compile_fn = functools.partial(_compile_cuda_bindings, module)
            else:
                major, minor = module.getVersion()
                compile_fn = functools.partial(_compile_cupy, module)
            return name, f"{major}.{minor}", compile_fn
        except Exception as e:  # not installed, or installed without the NVRTC library
            reasons.append(f"  {name}: {type(e).__name__}: {e}")
    raise CompilerNotFound("NVRTC cannot be loaded:\n" + "\n".join(reasons) + f"\n{INSTALL_HINT}")


def _ok(module, err, call):
    if err != module.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"{call} returned {err}")


def _compile_cuda_bindings(nvrtc, source, name, options, expressions=()):
    """NVIDIA's cuda.bindings: every call returns (nvrtcResult, values...)."""
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    _ok(nvrtc, err, "nvrtcCreateProgram")
    try:
        for expr in expressions:  # template instantiations to compile (as CuPy does)
            (err,) = nvrtc.nvrtcAddNameExpression(prog, expr.encode())
            _ok(nvrtc, err, "nvrtcAddNameExpression")
        opts = [o.encode() for o in options]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        _ok(nvrtc, err, "nvrtcGetProgramLogSize")
        log = b" " * size
        (err,) = nvrtc.nvrtcGetProgramLog(prog, log)
        _ok(nvrtc, err, "nvrtcGetProgramLog")
        ok = result == nvrtc.nvrtcResult.NVRTC_SUCCESS
        return ok, log.rstrip(b"\0 ").decode(errors="replace")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _compile_cupy(nvrtc, source, name, options, expressions=()):
    """CuPy's binding: compileProgram raises NVRTCError, the log is still there to read."""
    prog = nvrtc.createProgram(source, name, [], [])
    try:
        for expr in expressions:
            nvrtc.addNameExpression(prog, expr)
        try:
            nvrtc.compileProgram(prog, list(options))
            ok = True
        except nvrtc.NVRTCError:
            ok = False
        return ok, nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)


@functools.lru_cache(maxsize=None)
def _nvcc_version(nvcc):
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+\.\d+)", out)
    return m[1] if m else "?"


@functools.lru_cache(maxsize=None)
def _cuda_include_dirs():
    """CUDA headers (cuda_fp16.h...) for NVRTC, which has none of its own: $CUDA_PATH/include,
    $CUDA_HOME/include, nvcc's include folder, or the nvidia-cuda-runtime-cu12 wheel's."""
    candidates = [os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME")]
    if nvcc := shutil.which("nvcc"):
        candidates.append(str(Path(nvcc).resolve().parent.parent))
    candidates.append("/usr/local/cuda")
    for root in candidates:
        if root and (Path(root) / "include" / "cuda_fp16.h").is_file():
            return (str(Path(root) / "include"),)
    try:
        import nvidia.cuda_runtime as runtime  # the pip wheel's headers

        include = Path(list(runtime.__path__)[0]) / "include"
        return (str(include),) if (include / "cuda_fp16.h").is_file() else ()
    except ImportError:
        return ()


def cuda_include_options() -> tuple:
    """("-I<dir>",) for CUDA's headers (cuda_fp16.h, cuda_bf16.h, mma.h), for a CuPy launch of
    a kernel that includes them; () where none are found (CuPy's own search then applies)."""
    return tuple(f"-I{d}" for d in _cuda_include_dirs())


def backend_available(backend: str) -> bool:
    """True when `backend` ("nvrtc" or "nvcc") can compile on this machine."""
    if backend == "nvcc":
        return shutil.which("nvcc") is not None
    try:
        _nvrtc()
        return True
    except CompilerNotFound:
        return False


def _pick_backend(backend):
    if backend is None:
        try:
            _nvrtc()
            return "nvrtc"
        except CompilerNotFound as e:
            if shutil.which("nvcc"):
                return "nvcc"
            raise CompilerNotFound(
                f"no CUDA compiler here: nvcc is not on the PATH and {e}"
            ) from None
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS} or None, got {backend!r}")
    if backend == "nvcc" and shutil.which("nvcc") is None:
        raise CompilerNotFound(
            "backend 'nvcc': nvcc is not on the PATH. Install the CUDA toolkit "
            "or use backend 'nvrtc' (pip install nvidia-cuda-nvrtc-cu12)"
        )
    if backend == "nvrtc":
        _nvrtc()  # raises CompilerNotFound with the reasons and the install line
    return backend


def compile_file(path, arch: str = "sm_90", backend: str | None = None,
                 instantiations=None, defines=None) -> list[dict]:
    """compile_records, kept on disk (ckptlab.kernels.ptxas_cache): a changed source, header or
    compiler compiles again. Records read back carry the compile_s of the compile that made them."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path: expected an existing .cu file, got {str(path)!r}")
    kept, picked, names = kept_path(path, arch, backend, instantiations, defines)
    records = ptxas_cache.load(kept)
    if records is None:
        records = compile_records(path, arch, picked, names, defines)
        ptxas_cache.store(kept, records)
    return records


def kept_path(path, arch: str, backend=None, instantiations=None, defines=None) -> tuple:
    """(where compile_file keeps these records, the backend, the instantiations compiled):
    what a caller asks to know whether a compile is already on disk."""
    path = Path(path)
    names = arch_support.to_compile(path.name, arch, instantiations)  # refusals: no compiler
    picked = _pick_backend(backend)
    label = (f"nvrtc {_nvrtc()[1]} ({_nvrtc()[0]})" if picked == "nvrtc"
             else f"nvcc {_nvcc_version(shutil.which('nvcc'))}")
    return (ptxas_cache.path_for(path, arch, label, names, defines,
                                 _cuda_include_dirs() if picked == "nvrtc" else ()),
            picked, names)


def compile_records(path, arch: str = "sm_90", backend: str | None = None,
                    instantiations=None, defines=None) -> list[dict]:
    """Compile one .cu file to a cubin for `arch` and return ptxas' records for its functions,
    each with file, kernel (demangled), backend ("nvrtc 12.9 (cuda.bindings.nvrtc)", "nvcc
    13.0") and compile_s (the whole file's wall time). Raises CompileError with the log.
    Template kernels are compiled only when instantiated: `instantiations` (default: the ones
    ckptlab.kernels launches from this file that `arch` runs, ckptlab.kernels.archs; one it
    cannot run raises ArchUnsupported, before any compile) are added as NVRTC name
    expressions, or for nvcc taken by address at the end of a copy of the source. `defines`
    ({"TILE": 32}) are passed as -D options, e.g. to compile a kernel at another tile size."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path: expected an existing .cu file, got {str(path)!r}")
    instantiations = arch_support.to_compile(path.name, arch, instantiations)
    backend = _pick_backend(backend)
    includes = [f"-I{path.resolve().parent}"]
    includes += [f"-D{name}={value}" for name, value in dict(defines or {}).items()]
    start = time.perf_counter()
    if backend == "nvrtc":
        binding, version, compile_fn = _nvrtc()
        label = f"nvrtc {version} ({binding})"
        includes += [f"-I{d}" for d in _cuda_include_dirs()]
        options = [f"-arch={arch}", "-Xptxas=-v", "-std=c++17", *includes]
        ok, log = compile_fn(path.read_text(), path.name, options, tuple(instantiations))
    else:
        nvcc = shutil.which("nvcc")
        label = f"nvcc {_nvcc_version(nvcc)}"
        with tempfile.TemporaryDirectory() as tmp:
            flags = "-cubin --resource-usage -Xptxas -v -std=c++17".split()
            out = str(Path(tmp) / "out.cubin")
            src = path
            if instantiations:  # host code taking each address makes nvcc instantiate it
                src = Path(tmp) / path.name
                refs = ", ".join(f"(void*)&{e}" for e in instantiations)
                src.write_text(path.read_text() +
                               f"\nstatic void* const ckptlab_instances[] = {{{refs}}};\n")
            cmd = [nvcc, f"-arch={arch}", *flags, *includes, "-o", out, str(src)]
            run = subprocess.run(cmd, capture_output=True, text=True)
        ok, log = run.returncode == 0, run.stdout + run.stderr
    seconds = time.perf_counter() - start
    if not ok:
        missing_headers = "cuda_fp16.h" in log or "cuda_bf16.h" in log
        raise CompileError(path, arch, label, log + (HEADERS_HINT if missing_headers else ""))
    records = parse_ptxas_log(log, arch)
    names = demangle([r["symbol"] for r in records])
    for record, name in zip(records, names, strict=True):
        record.update(file=path.name, kernel=short_name(name), backend=label, compile_s=seconds)
    return records


# ---------------------------------------------------------------- report


def _resolve(files):
    if files is None:
        return sorted(Path(KERNELS_DIR).glob("*.cu"))
    if isinstance(files, (str, Path)):
        files = [files]
    paths = []
    for f in files:
        p = Path(f)
        if not p.is_file() and (Path(KERNELS_DIR) / p).is_file():
            p = Path(KERNELS_DIR) / p
        if not p.is_file():
            raise ValueError(f"files: {str(f)!r} is neither a file nor a name in {KERNELS_DIR}")
        paths.append(p)
    return paths


def report(files=None, arch: str = "sm_90", backend: str | None = None) -> list[dict]:
    """Records for every kernels/*.cu (or the given files or names in kernels/) for `arch`:
    each file's kernels in source order (ptxas reports them backwards), then its device
    functions."""
    rows = []
    for path in _resolve(files):
        rows += _source_order(compile_file(path, arch, backend), path.read_text())
    return rows


def _source_order(records, source):
    def key(r):
        base = r["kernel"].split("<")[0]  # a template's name, or the extern "C" name
        m = re.search(rf"\b{re.escape(base)}\s*\(", source)
        natural = [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", r["kernel"])]
        return (r["kind"] != "kernel", m.start() if m else len(source), natural)

    return sorted(records, key=key)
