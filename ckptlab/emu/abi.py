"""The Python side of abi.h: the constants read from it, and ctypes mirrors of its structures,
checked against every library the emulator loads (check_library), so that a structure changed
on one side only fails loudly at load time instead of passing wrong bytes."""

from __future__ import annotations

import ctypes
from pathlib import Path

from ckptlab import cdefs

HEADER = Path(__file__).resolve().parent / "abi.h"
_C = cdefs.read(HEADER)

VERSION = _C["EMU_ABI_VERSION"]
MAX_ARGS = _C["EMU_MAX_ARGS"]
MAX_WORKERS = _C["EMU_MAX_WORKERS"]
AUTO_MIN_THREADS = _C["EMU_AUTO_MIN_THREADS"]
SHADOW_BYTES = _C["EMU_SHADOW_BYTES"]
MAX_BLOCK_THREADS = _C["EMU_MAX_BLOCK_THREADS"]
BLOCK_LIMITS = (_C["EMU_MAX_BLOCK_X"], _C["EMU_MAX_BLOCK_Y"], _C["EMU_MAX_BLOCK_Z"])
GRID_LIMITS = (_C["EMU_MAX_GRID_X"], _C["EMU_MAX_GRID_Y"], _C["EMU_MAX_GRID_Z"])
SHARED_STATIC_LIMIT = _C["EMU_SHARED_STATIC_LIMIT"]
SHARED_OPTIN_LIMIT = _C["EMU_SHARED_OPTIN_LIMIT"]
# fault code -> short name ("barrier", "warp", ...): the EMU_F_* enumerators of abi.h
FAULT_NAMES = {v: k.removeprefix("EMU_F_").lower() for k, v in _C.items()
               if k.startswith("EMU_F_") and k != "EMU_F_NONE"}
# access kind -> name: the EmuAccessKind enumerators ("read", "write", "atomic")
ACCESS_KINDS = {v: k.removeprefix("EMU_ACCESS_").lower() for k, v in _C.items()
                if k.startswith("EMU_ACCESS_")}
TRACE_SIZE_BITS = _C["EMU_TRACE_SIZE_BITS"]
WARP_OPS = {k: v for k, v in _C.items()
            if k.startswith(("EMU_SHFL_", "EMU_BALLOT", "EMU_ANY", "EMU_ALL", "EMU_SYNCWARP",
                                 "EMU_WMMA"))}


class Buf(ctypes.Structure):
    _fields_ = [("lo", ctypes.c_uint64), ("size", ctypes.c_uint64), ("arg", ctypes.c_int32),
                ("param", ctypes.c_int32), ("readonly", ctypes.c_int32), ("pad", ctypes.c_int32)]


class Config(ctypes.Structure):
    _fields_ = [("counted", ctypes.c_int32), ("race_check", ctypes.c_int32),
                ("stack_kib", ctypes.c_int32), ("shuffle_blocks", ctypes.c_int32),
                ("watchdog_s", ctypes.c_double), ("seed", ctypes.c_uint64),
                ("kernel", ctypes.c_int32), ("shared_opt_in", ctypes.c_int32),
                ("workers", ctypes.c_int32), ("pad", ctypes.c_int32),
                ("fiber_region", ctypes.c_uint64), ("trace", ctypes.c_uint64),
                ("trace_cap", ctypes.c_uint64)]


class FiberRegion(ctypes.Structure):
    _fields_ = [("base", ctypes.c_uint64), ("span", ctypes.c_uint64),
                ("stack_size", ctypes.c_uint64), ("shift", ctypes.c_int32),
                ("workers", ctypes.c_int32), ("mapped", ctypes.c_int32 * MAX_WORKERS)]


class Counters(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64 * MAX_ARGS)
                for n in ("read", "write", "atomic_ops", "atomic_bytes", "unique_read",
                  "unique_write")] + [
        (n, ctypes.c_uint64)
        for n in ("shared_read", "shared_write", "shared_atomics", "threads", "blocks",
                  "workers")]


class TraceEvent(ctypes.Structure):
    _fields_ = [("where", ctypes.c_uint64), ("block", ctypes.c_uint32),
                ("thread", ctypes.c_uint16), ("arg", ctypes.c_uint8), ("kind", ctypes.c_uint8)]


class Fault(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("has_thread", ctypes.c_int32),
                ("block", ctypes.c_uint32 * 3), ("thread", ctypes.c_uint32 * 3),
                ("pc", ctypes.c_uint64), ("line", ctypes.c_int32), ("pad", ctypes.c_int32),
                ("file", ctypes.c_char * 256), ("message", ctypes.c_char * 2048)]


STRUCTS = {"Buf": Buf, "Config": Config, "Counters": Counters, "Fault": Fault,
           "FiberRegion": FiberRegion, "TraceEvent": TraceEvent}
FIBER_REGION = FiberRegion()  # the process's (abi.h): every module's launches share it


def layout() -> str:
    """The ctypes structures' layout in emu_abi_layout()'s form: "Buf.lo@0+8,..." (padding
    fields, named pad, are not listed)."""
    parts = []
    for name, struct in STRUCTS.items():
        for field, _ in struct._fields_:
            if field != "pad":
                f = getattr(struct, field)
                parts.append(f"{name}.{field}@{f.offset}+{f.size}")
    return ",".join(parts)


class AbiMismatch(RuntimeError):
    """A built module and this Python package disagree on the structures they exchange."""


def check_library(lib, path) -> None:
    """Refuse a module built against another abi.h: compare its version and its layout."""
    lib.emu_abi_version.restype = ctypes.c_int
    lib.emu_abi_layout.restype = ctypes.c_char_p
    version, theirs = lib.emu_abi_version(), lib.emu_abi_layout().decode()
    if version != VERSION or theirs != layout():
        raise AbiMismatch(f"{path}: emulator ABI {version} ({theirs}) does not match this "
                          f"package's {VERSION} ({layout()}); delete the module to rebuild it")
