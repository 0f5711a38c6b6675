"""The CPU emulator: runs kernels/*.cu unchanged on a CPU and counts every global-memory byte.

Same surface as CuPy's RawModule, so launch wrappers don't care which target they are on:

    mod = emu.RawModule(code=src, options=("-Ikernels",))
    f = mod.get_function("attn_flash_fwd")
    f((gx, gy), (bx,), (q, k, v, o, np.int32(N), np.float32(scale)), shared_mem=0)

Emulator-only extras (not in CuPy): configure()/settings() (mode "counted" or "fast", race
check, stack size, watchdog, workers; each thread's own, DEFAULT resets one: config.py),
last_launch() and record() for the per-argument byte counts, trace() for who read and wrote
each element of each argument (tracing.py), and EmuError for faults inside
kernels (barrier misuse, out-of-bounds or misaligned access, shared-memory race, stack
overflow, runaway kernel...), which name the kernel, block, thread and source line and leave
the Python process running. How it works: shim.h, then
runtime.h (scheduler.cpp, memory.cpp, workers.cpp, launch.cpp).
"""

from .build import EmuCompileError, EmuError, cache_dir
from .config import DEFAULT, Settings, configure, current, settings
from .counters import ArgTraffic, Launch, Recording, last_launch, record
from .loader import EmuArgumentError, Kernel, RawModule, kernel_names
from .tracing import ArgTrace, LaunchTrace, Tracing, trace

__all__ = [
    "DEFAULT", "ArgTrace", "ArgTraffic", "EmuArgumentError", "EmuCompileError", "EmuError",
    "Kernel", "Launch", "LaunchTrace", "RawModule", "Recording", "Settings", "Tracing",
    "cache_dir", "configure", "current", "kernel_names", "last_launch", "record", "settings",
    "trace",
]
