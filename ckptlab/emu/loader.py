"""CuPy's RawModule surface on the CPU: RawModule(code=...).get_function(name)(grid, block,
args, shared_mem=0) runs a kernel on the emulator. Arguments are checked against the kernel's
own C parameter types before anything runs: a wrong count, a Python scalar where the kernel
takes a 32-bit one (CuPy would pass 64 bits), a wrong dtype, a non-contiguous or read-only
array for a written pointer, all raise EmuArgumentError with the parameter's name. The
kernels' names, parameter names and C types are read from the source by signature.py.
"""

from __future__ import annotations

import ctypes
import random
import threading
import time
from pathlib import Path

import numpy as np

from . import abi, config, tracing
from .build import EmuError, build_module, source_line
from .counters import ArgTraffic, Launch, _publish
from .signature import VECTOR_BYTES, dtype_for, kernel_names, parameter_names

MAX_BLOCK_THREADS = abi.MAX_BLOCK_THREADS
DEFAULT_SHARED_LIMIT = abi.SHARED_STATIC_LIMIT  # beyond it a GPU launch must opt in
_LAUNCH_LOCK = threading.Lock()  # one launch at a time per process (signals are global)
_seeds = random.Random()  # block orders of shuffled launches: a fresh order each launch


def _next_seed() -> int:
    seed = config.current().block_seed
    return _seeds.getrandbits(64) if seed is None else seed


SHADOW_PER_BYTE = abi.SHADOW_BYTES / 4  # the race check: one Shadow per 4 argument bytes
ASK_MEMORY_ABOVE = 64 << 20  # a launch needing less does not look at the available memory


def launch_memory_bytes(arrays, race_check, trace_events: int = 0) -> int:
    """Memory a counted launch allocates beside its arguments: a staged copy of each (to check
    accesses against it), two unique-byte bitmaps (a bit per byte each), with the race check a
    shadow entry per 4 bytes, and with the trace its events (tracing.EVENT_BYTES each, as many as
    the cap allows). race_check=None: fast mode, nothing."""
    if race_check is None:
        return 0
    total = sum(a.nbytes for a in arrays)
    return int(total * (1 + 0.25 + (SHADOW_PER_BYTE if race_check else 0))) + (
        trace_events * tracing.EVENT_BYTES)


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class EmuArgumentError(EmuError, TypeError):
    """Arguments that don't match the kernel's parameters (also a TypeError)."""


# ---- the module -----------------------------------------------------------------------------
class RawModule:
    """A .cu source compiled for the emulator, with CuPy's RawModule constructor and
    get_function(). Options understood: -I, -D, -U (others, e.g. -std=, are NVRTC's own)."""

    def __init__(self, code=None, *, path=None, options=(), name_expressions=None,
                 name=None, backend=None, jitify=False, translate_cucomplex=False,
                 enable_cooperative_groups=False):
        if (code is None) == (path is None):
            raise TypeError("RawModule needs exactly one of code= or path=")
        if path is not None:
            code = Path(path).read_text()
            name = name or Path(path).name
        self.code = code
        self.name = name or "<string>"
        self.options = tuple(options)
        self.name_expressions = tuple(name_expressions or ())
        self._expressions = kernel_names(code) + [
            e for e in self.name_expressions if e not in kernel_names(code)]
        self._libs: dict = {}  # mode -> (ctypes library, path)

    def _library(self, mode: str):
        if mode not in self._libs:
            path = build_module(self.code, self.name, self._expressions, self.options, mode)
            try:
                lib = ctypes.CDLL(str(path))
            except OSError:  # damaged in a way its ELF headers do not show: build it again
                path.unlink(missing_ok=True)
                path = build_module(self.code, self.name, self._expressions, self.options, mode)
                lib = ctypes.CDLL(str(path))
            abi.check_library(lib, path)
            lib.emu_launch.restype = ctypes.c_int
            lib.emu_launch.argtypes = [
                ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32),
                ctypes.POINTER(ctypes.c_uint32), ctypes.c_uint64, ctypes.POINTER(abi.Buf),
                ctypes.c_int, ctypes.POINTER(abi.Config), ctypes.POINTER(abi.Counters)]
            lib.emu_fault.restype = ctypes.POINTER(abi.Fault)
            lib.emu_trace_events.restype = ctypes.c_uint64
            self._libs[mode] = (lib, path)
        return self._libs[mode]

    def get_function(self, name: str) -> Kernel:
        if name not in self._expressions:
            raise AttributeError(
                f"no kernel {name!r} in {self.name}: found {self._expressions or 'none'} "
                '(kernels must be `extern "C" __global__`, or templates named in '
                "name_expressions)")
        index = self._expressions.index(name)
        self._library(config.current().mode)  # compile now: errors show here, not at launch
        return Kernel(self, name, index)


class Kernel:
    """One kernel: call it as kernel(grid, block, args, shared_mem=0), like cupy.RawKernel."""

    def __init__(self, module: RawModule, name: str, index: int):
        self.module, self.name, self.index = module, name, index
        self.max_dynamic_shared_size_bytes = DEFAULT_SHARED_LIMIT
        lib, _ = module._library(config.current().mode)
        sig_fn = getattr(lib, f"emu_sig_{index}")
        sig_fn.restype = ctypes.c_char_p
        sig = sig_fn().decode()
        self.param_types = [] if sig == "void" else sig.split(",")
        names = parameter_names(module.code, name.split("<")[0].strip())
        if len(names) != len(self.param_types):
            names = [f"arg{i}" for i in range(len(self.param_types))]
        self.param_names = names

    @property
    def params(self) -> list[tuple[str, str]]:
        """(C type, name) of each parameter, e.g. ("const float*", "Q")."""
        return list(zip(self.param_types, self.param_names, strict=True))

    def _error(self, msg: str) -> EmuArgumentError:
        return EmuArgumentError(f"{self.name}: {msg}", kind="argument", kernel=self.name)

    def _dims(self, value, what: str, limits) -> tuple:
        def integer(v):
            return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))

        if integer(value):
            value = (value,)
        if not isinstance(value, (tuple, list)) or not all(integer(v) for v in value):
            raise self._error(f"{what} must be an int or a tuple of 1 to 3 ints, got "
                              f"{value!r}")
        dims = tuple(int(v) for v in value)
        if not 1 <= len(dims) <= 3:
            raise self._error(f"{what} must have 1 to 3 dimensions, got {dims}")
        dims = dims + (1,) * (3 - len(dims))
        for axis, (d, lim) in enumerate(zip(dims, limits, strict=True)):
            if not 1 <= d <= lim:
                raise self._error(f"{what}[{axis}] = {d} is outside [1, {lim}]")
        return dims

    def _pack(self, args):
        """ctypes argument array, keep-alive list and argument buffers, after checking."""
        if not isinstance(args, (tuple, list)):
            raise self._error(f"args must be a tuple, got {type(args).__name__}")
        if len(args) != len(self.param_types):
            want = ", ".join(f"{t} {n}" for t, n in self.params) or "none"
            raise self._error(f"takes {len(self.param_types)} arguments ({want}), got "
                              f"{len(args)}")
        pointers = sum(t.endswith("*") for t in self.param_types)
        if pointers > abi.MAX_ARGS:
            raise self._error(f"has {pointers} pointer parameters; the emulator tracks at most "
                              f"{abi.MAX_ARGS} (EMU_MAX_ARGS in ckptlab/emu/abi.h)")
        keep, bufs = [], []
        ptrs = (ctypes.c_void_p * max(1, len(args)))()
        for i, ((ctype, pname), value) in enumerate(zip(self.params, args, strict=True)):
            where = f"argument {i} ({ctype} {pname})"
            if ctype.endswith("*"):
                base = ctype[:-1].replace("const ", "").strip()
                if type(value).__module__.split(".")[0] == "cupy":
                    raise self._error(f"{where} is a CuPy (GPU) array; the emulator runs on "
                                      "the CPU and takes NumPy arrays")
                if not isinstance(value, np.ndarray):
                    raise self._error(f"{where} must be a NumPy array, got "
                                      f"{type(value).__name__}")
                want = dtype_for(base)
                if want is None:
                    raise self._error(f"{where}: pointers to {base} are not supported by the "
                                      "emulator")
                if value.dtype != want:
                    raise self._error(f"{where} must have dtype {np.dtype(want)}, got "
                                      f"{value.dtype}")
                if not value.flags.c_contiguous:
                    raise self._error(f"{where} must be C-contiguous (kernels ignore strides: "
                                      "pass np.ascontiguousarray(x), never x.T)")
                if not ctype.startswith("const") and not value.flags.writeable:
                    raise self._error(f"{where} is written by the kernel but the array is "
                                      "read-only")
                vec = VECTOR_BYTES.get(base)
                if vec and (value.nbytes % vec or value.ctypes.data % vec):
                    raise self._error(f"{where} needs a size and address that are multiples "
                                      f"of {vec} bytes")
                holder = ctypes.c_void_p(value.ctypes.data)  # counted mode: the staged copy's
                keep += [value, holder]
                ptrs[i] = ctypes.addressof(holder)
                bufs.append(abi.Buf(value.ctypes.data, value.nbytes, len(bufs), i,
                                    int(ctype.startswith("const")), 0))
            else:
                want = dtype_for(ctype)
                if want is None or ctype in VECTOR_BYTES:
                    raise self._error(f"{where}: by-value parameters of type {ctype} are not "
                                      "supported by the emulator")
                if not isinstance(value, np.generic) or value.dtype != want:
                    got = type(value).__name__
                    hint = (" (CuPy would pass a Python scalar as a 64-bit value: wrong bytes "
                            "for this parameter)" if isinstance(value, (int, float, bool))
                            else "")
                    raise self._error(f"{where} must be np.{np.dtype(want).name}(...), got "
                                      f"{got}{hint}")
                holder = np.array(value, dtype=want)
                keep.append(holder)
                ptrs[i] = holder.ctypes.data
        cbufs = (abi.Buf * max(1, len(bufs)))(*bufs)
        return ptrs, keep, cbufs, len(bufs)

    def __call__(self, grid, block, args, *, shared_mem=0, stream=None,
                 enable_cooperative_groups=False):
        grid = self._dims(grid, "grid", abi.GRID_LIMITS)
        block = self._dims(block, "block", abi.BLOCK_LIMITS)
        threads = block[0] * block[1] * block[2]
        if threads > abi.MAX_BLOCK_THREADS:
            raise self._error(f"block {block} has {threads} threads; at most "
                              f"{MAX_BLOCK_THREADS} are allowed")
        shared_mem = int(shared_mem)
        if shared_mem < 0:
            raise self._error(f"shared_mem must be >= 0, got {shared_mem}")
        if shared_mem > self.max_dynamic_shared_size_bytes:
            raise self._error(
                f"shared_mem={shared_mem} bytes exceeds the {self.max_dynamic_shared_size_bytes}"
                "-byte limit: on a GPU more than 48 KiB of dynamic shared memory needs "
                "kernel.max_dynamic_shared_size_bytes raised first (e.g. up to 227 KiB on H100)")
        ptrs, keep, cbufs, nbuf = self._pack(args)
        s = config.current()
        tracing.check_launch(s, self.name, grid)
        self._check_memory(args, s)
        lib, path = self.module._library(s.mode)
        events = tracing.buffer(s)
        cfg = abi.Config(int(s.mode == "counted"), int(s.race_check), int(s.stack_kib),
                         int(s.block_order == "shuffled"), float(s.watchdog_s),
                         _next_seed() if s.block_order == "shuffled" else 0, self.index,
                         int(self.max_dynamic_shared_size_bytes > DEFAULT_SHARED_LIMIT),
                         config.workers_for_launch(s), 0, ctypes.addressof(abi.FIBER_REGION),
                         0 if events is None else events.ctypes.data,
                         0 if events is None else len(events))
        counters = abi.Counters()
        launcher = ctypes.cast(getattr(lib, f"emu_launch_{self.index}"), ctypes.c_void_p)
        with _LAUNCH_LOCK:
            t0 = time.perf_counter()
            rc = lib.emu_launch(launcher, ptrs, (ctypes.c_uint32 * 3)(*grid),
                                (ctypes.c_uint32 * 3)(*block), shared_mem, cbufs, nbuf,
                                ctypes.byref(cfg), ctypes.byref(counters))
            seconds = time.perf_counter() - t0
            traced = lib.emu_trace_events() if events is not None else 0
        del keep
        if rc != 0:
            raise self._fault(lib.emu_fault().contents, path)
        launch = Launch(kernel=self.name, module=self.module.name, grid=grid, block=block,
                        shared_mem=shared_mem, mode=s.mode, seconds=seconds,
                        threads=counters.threads, blocks=counters.blocks,
                        workers=counters.workers)
        if s.mode == "counted":  # counters are indexed by pointer parameter: 0, 1, ...
            names = [n for t, n in self.params if t.endswith("*")]
            launch.args = {
                n: ArgTraffic(counters.read[i], counters.write[i], counters.atomic_ops[i],
                              counters.atomic_bytes[i], counters.unique_read[i],
                              counters.unique_write[i])
                for i, n in enumerate(names)}
            launch.shared_read_bytes = counters.shared_read
            launch.shared_write_bytes = counters.shared_write
            launch.shared_atomics = counters.shared_atomics
        if events is not None:
            pointers = [a for (t, _), a in zip(self.params, args, strict=True) if t.endswith("*")]
            launch.trace = tracing.collect(events, traced, self.name, grid, block,
                                         dict(zip(launch.args, pointers, strict=True)))
        _publish(launch)
        return launch

    def _check_memory(self, args, s: config.Settings) -> None:
        arrays = [a for (t, _), a in zip(self.params, args, strict=True) if t.endswith("*")]
        need = launch_memory_bytes(arrays, s.race_check if s.mode == "counted" else None,
                                   s.trace_max_events if s.trace else 0)
        if need < ASK_MEMORY_ABOVE:  # not worth reading /proc/meminfo at every small launch
            return
        have = available_memory_bytes()
        if have is not None and need > have:
            mib = 1 << 20
            what = "the race check's shadow memory" if s.race_check else "staged copies"
            if s.trace:
                what += f" and {s.trace_max_events:,} trace events"
            raise EmuError(
                f"{self.name}: this launch needs about {need / mib:,.0f} MiB for {what} "
                f"(counted mode: a copy of each argument, 1/4 of it for the unique-byte "
                f"bitmaps, with the race check {SHADOW_PER_BYTE:g} bytes per argument "
                f"byte, with the trace {tracing.EVENT_BYTES} bytes per event), and "
                f"{have / mib:,.0f} MiB are available; run it with "
                f"emu.settings(race_check=False) or mode='fast' (or a smaller "
                f"trace_max_events), or smaller sizes", kind="config", kernel=self.name)

    def _fault(self, f: abi.Fault, library: Path) -> BaseException:
        kind = abi.FAULT_NAMES.get(f.kind, "fault")
        message = f.message.decode(errors="replace")
        for i, (_, n) in enumerate(self.params):
            message = message.replace(f"{{arg{i}}}", repr(n))
        file, line = f.file.decode(errors="replace") or None, f.line or None
        if not line and f.pc:
            file, line = source_line(library, f.pc, self.module.name)
        block, thread = tuple(f.block), tuple(f.thread) if f.has_thread else None
        where = [f"block {block}"] + ([f"thread {thread}"] if thread else [])
        if line:
            where.append(f"{file}:{line}")
        text = f"{self.name}: {message} [{', '.join(where)}]"
        if kind == "interrupt":
            return KeyboardInterrupt(text)
        return EmuError(text, kind=kind, kernel=self.name, block=block, thread=thread,
                        file=file, line=line)
