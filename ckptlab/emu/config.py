"""The emulator's settings: how kernels run and what is checked.

    mode        "counted" (default): the build with memory hooks: counts every global byte per
                argument, checks bounds, and (race_check) shared-memory races. "fast": the plain
                build: no counts, no bounds checks, ~2x quicker.
    race_check  flag a shared-memory access that conflicts with another thread's access since
                the last __syncthreads (on by default; counted mode only).
    stack_kib   stack size of each emulated thread (fiber), in KiB (default 64).
    watchdog_s  a launch running longer than this is stopped with an EmuError (default 120).
    block_order "serial" (default: blockIdx.x fastest, deterministic) or "shuffled": blocks in a
                random order, new each launch, as a GPU promises no order; atomics then sum in
                different orders and show their run-to-run differences.
    block_seed  with "shuffled": a fixed seed (int) for a reproducible order; None = fresh.
    workers     OS threads running the blocks of a launch at once; 1 runs them one after
                another, in order, on the calling thread. None (default): one per CPU this
                process may use, for launches of at least AUTO_MIN_THREADS threads (smaller ones
                run on the calling thread: waking workers would cost more than they save). A
                block's threads stay on one worker. Counts are the same whatever the number.
    trace       record who accessed what (False by default): for each access of a thread to a
                kernel argument, the block, the thread, the bytes and the kind (read, write,
                atomic); Launch.trace has them (tracing.py). Counted mode only: mode="fast" with
                trace=True is a ValueError (emu.trace() switches its block to counted itself).
    trace_max_events  the most events one launch records (default 4,000,000: 64 MiB); past it
                the kernel runs on, unrecorded, and its trace says `truncated`.

`with settings(...)` changes them for the code inside the block, in this thread (or asyncio
task) only: each thread's settings are its own (a contextvars.ContextVar), so overlapping blocks
in two threads cannot leave either in the other's. configure(...) changes them for the code
around it: inside a `with settings(...)` block, until that block ends; outside any, for the
process (what every thread without a block of its own sees). A value left out (or None) is
unchanged; DEFAULT resets a setting to its built-in default above, whatever the environment
says: `settings(workers=DEFAULT)` is automatic, `settings(block_seed=DEFAULT)` a fresh order.
The environment presets the process's settings: CKPTLAB_EMU_MODE, CKPTLAB_EMU_RACE_CHECK (0/1,
false/true, no/yes, off/on, any case), CKPTLAB_EMU_STACK_KIB, CKPTLAB_EMU_WATCHDOG_S,
CKPTLAB_EMU_WORKERS.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from dataclasses import dataclass, fields, replace

from . import abi

AUTO_MIN_THREADS = abi.AUTO_MIN_THREADS  # abi.h: EMU_AUTO_MIN_THREADS
# A launch's trace holds at most this many 16-byte events by default (64 MiB): a small launch
# makes far fewer (SGEMM 40 x 24 x 56 with 16 x 16 tiles: 9,472 global accesses; the flash
# forward at B = H = 1, N = 40, d = 16, Br = Bc = 16: 5,160; tests/test_emu_trace_kernels.py
# checks both formulas), and a big one takes longer to analyse than to run.
TRACE_MAX_EVENTS = 4_000_000


def workers_for_launch(s: "Settings") -> int:
    """The Config.workers of a launch: the number asked for, or -(CPUs) for automatic."""
    return s.workers if s.workers is not None else -cpus()


def cpus() -> int:
    """CPUs this process may run on (its affinity mask, else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class Settings:
    mode: str = "counted"
    race_check: bool = True
    stack_kib: int = 64
    watchdog_s: float = 120.0
    block_order: str = "serial"
    block_seed: int | None = None
    workers: int | None = None
    trace: bool = False
    trace_max_events: int = TRACE_MAX_EVENTS


def _env_number(name: str, kind, default):
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{name}={text!r}: expected {'an integer' if kind is int else 'a number'}"
                         ) from None


FLAG_VALUES = {"1": True, "true": True, "yes": True, "on": True,
               "0": False, "false": False, "no": False, "off": False}


def _env_flag(name: str, default: bool) -> bool:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        return FLAG_VALUES[text.strip().lower()]
    except KeyError:
        raise ValueError(f"{name}={text!r}: expected one of {', '.join(FLAG_VALUES)}") from None


def from_environment() -> Settings:
    """The settings CKPTLAB_EMU_* describe (defaults for those unset); a ValueError naming the
    variable for a value that is not one (the command line checks this before any work)."""
    s = Settings()
    env = os.environ
    return _checked(replace(
        s,
        mode=env.get("CKPTLAB_EMU_MODE", s.mode),
        race_check=_env_flag("CKPTLAB_EMU_RACE_CHECK", s.race_check),
        stack_kib=_env_number("CKPTLAB_EMU_STACK_KIB", int, s.stack_kib),
        watchdog_s=_env_number("CKPTLAB_EMU_WATCHDOG_S", float, s.watchdog_s),
        workers=_env_number("CKPTLAB_EMU_WORKERS", int, s.workers),  # unset: None, automatic
    ))


def _checked(s: Settings) -> Settings:
    for name in ("race_check", "trace"):  # 0.5 or "no" must not turn a flag off silently
        if not isinstance(getattr(s, name), bool):
            raise ValueError(f"{name} must be True or False, got {getattr(s, name)!r}")
    if s.block_seed is not None and (isinstance(s.block_seed, bool) or not isinstance(
            s.block_seed, int) or not 0 <= s.block_seed < 1 << 64):
        raise ValueError(f"block_seed must be None (a fresh order each launch) or an int in "
                         f"[0, 2**64), got {s.block_seed!r}")
    if s.mode not in ("counted", "fast"):
        raise ValueError(f"emulator mode must be 'counted' or 'fast', got {s.mode!r}")
    if not 8 <= s.stack_kib <= 64 * 1024:
        raise ValueError(f"stack_kib must be in [8, 65536] KiB, got {s.stack_kib}")
    if s.block_order not in ("serial", "shuffled"):
        raise ValueError(f"block_order must be 'serial' or 'shuffled', got {s.block_order!r}")
    if not s.watchdog_s > 0:
        raise ValueError(f"watchdog_s must be > 0 seconds, got {s.watchdog_s}")
    if s.trace and s.mode != "counted":
        raise ValueError("trace=True needs mode='counted' (the fast build has no memory hooks "
                         "to record accesses from); emu.trace() runs its block counted")
    if (isinstance(s.trace_max_events, bool) or not isinstance(s.trace_max_events, int)
            or not 1 <= s.trace_max_events <= 1 << 32):
        raise ValueError(f"trace_max_events must be an int in [1, 2**32], got "
                         f"{s.trace_max_events!r}")
    if s.workers is not None and (isinstance(s.workers, bool) or not isinstance(s.workers, int)
                                  or not 1 <= s.workers <= abi.MAX_WORKERS):
        raise ValueError(f"workers must be None (one per CPU) or an int in [1, "
                         f"{abi.MAX_WORKERS}], got {s.workers!r}")
    return s


class _Default:
    """A setting's built-in default: settings(workers=DEFAULT), configure(block_seed=DEFAULT)."""

    def __repr__(self) -> str:
        return "ckptlab.emu.DEFAULT"


DEFAULT = _Default()
_BUILT_IN = Settings()
_process = from_environment()  # what a thread sees outside any `with settings(...)` block
_local: contextvars.ContextVar[Settings | None] = contextvars.ContextVar(
    "ckptlab_emu_settings", default=None)  # inside one: this thread's (or task's) own


def current() -> Settings:
    """The settings a launch from this thread (or asyncio task) runs with."""
    s = _local.get()
    return _process if s is None else s


def _changed(base: Settings, changes: dict) -> Settings:
    names = {f.name for f in fields(Settings)}
    unknown = sorted(set(changes) - names)
    if unknown:
        raise TypeError(f"unknown emulator setting(s) {', '.join(unknown)}: expected some of "
                        f"{', '.join(sorted(names))}")
    values = {k: getattr(_BUILT_IN, k) if v is DEFAULT else v for k, v in changes.items()
              if v is not None}
    return _checked(replace(base, **values))


def configure(*, mode=None, race_check=None, stack_kib=None, watchdog_s=None,
              block_order=None, block_seed=None, workers=None, trace=None,
              trace_max_events=None) -> Settings:
    """Change the settings of the code around this call (inside a `with settings(...)` block:
    until it ends; outside any: the process's); returns the previous ones. None leaves a
    setting unchanged, DEFAULT resets it to its built-in default."""
    global _process
    previous = current()
    new = _changed(previous, dict(mode=mode, race_check=race_check, stack_kib=stack_kib,
                                  watchdog_s=watchdog_s, block_order=block_order,
                                  block_seed=block_seed, workers=workers, trace=trace,
                                  trace_max_events=trace_max_events))
    if _local.get() is None:
        _process = new
    else:
        _local.set(new)
    return previous


@contextlib.contextmanager
def settings(**changes):
    """Temporary settings for this thread (or asyncio task): `with emu.settings(mode="fast"):`.
    Other threads keep theirs; None leaves a setting unchanged, DEFAULT resets it."""
    token = _local.set(_changed(current(), changes))
    try:
        yield _local.get()
    finally:
        _local.reset(token)
