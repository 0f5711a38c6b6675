"""Who touched what: the access trace of a launch, per kernel argument and element.

    with emu.trace() as tr:                        # counted mode inside, whatever the mode around
        kernel(grid, block, (A, B, C, M, N, K))
    t = tr.last["A"]                               # the last traced launch's argument A
    t.count("read", by="block")                    # (M, K): distinct blocks that read each element
    t.mask("read", block=(1, 2))                   # (M, K) bool: what block (1, 2) read
    t.readers((37, 50), by="block")                # [(0, 2, 0), (1, 2, 0)]: who read A[37, 50]
    tr.last["C"].never_written()                   # [] (a kernel that skips C[3, 5]: [(3, 5)])

Or `emu.settings(trace=True)` and `emu.last_launch().trace`. The runtime records one event per
access of a thread to a pointer argument (trace.cpp: 16 bytes, in counted mode's full access
path); here the events become one row per element each access covered (an element is an item
of the argument's dtype, its index the flat index into the array, unravelled with its shape).
An atomic both reads and writes its element: "read" and "write" include atomics. Shared memory,
__device__ variables and malloc'd memory are not traced, nor accesses of an argument that lie
past it in an overlapping one (they count against the first, as the byte counts do).

A launch records at most `max_events` events (default config.TRACE_MAX_EVENTS). Past it the
kernel runs on (outputs and byte counts stay right) but nothing more is recorded: the trace is
`truncated`, its counts are lower bounds, and never_written() refuses to answer.
"""

from __future__ import annotations

import contextlib
import ctypes

import numpy as np

from . import abi, config
from .counters import Recording, record

READ, WRITE, ATOMIC = (next(k for k, v in abi.ACCESS_KINDS.items() if v == name)
                       for name in ("read", "write", "atomic"))
_FIELDS = [n for n, _ in abi.TraceEvent._fields_]
# abi.h's EmuTraceEvent as NumPy sees it (offsets from the ctypes mirror, checked against C++)
EVENT = np.dtype({"names": _FIELDS, "formats": ["<u8", "<u4", "<u2", "u1", "u1"],
                  "offsets": [getattr(abi.TraceEvent, n).offset for n in _FIELDS],
                  "itemsize": ctypes.sizeof(abi.TraceEvent)})
EVENT_BYTES = EVENT.itemsize  # what one recorded access costs while the launch runs
_SIZE_MASK = (1 << abi.TRACE_SIZE_BITS) - 1
KINDS = ("read", "write", "atomic")
BY = ("block", "thread", "access")


def _linear(index, dims: tuple, what: str) -> int:
    """blockIdx / threadIdx (an int = x, or a tuple of 1 to 3 ints) as a linear index."""
    idx = (index,) if isinstance(index, (int, np.integer)) else tuple(index)
    if not 1 <= len(idx) <= 3 or not all(isinstance(v, (int, np.integer)) for v in idx):
        raise TypeError(f"{what} must be an int or a tuple of 1 to 3 ints, got {index!r}")
    idx = idx + (0,) * (3 - len(idx))
    if not all(0 <= v < d for v, d in zip(idx, dims, strict=True)):
        raise ValueError(f"{what} {idx} is outside the launch's {dims}")
    return int(idx[0] + dims[0] * (idx[1] + dims[1] * idx[2]))


def _unlinear(linear: int, dims: tuple) -> tuple:
    return (int(linear % dims[0]), int(linear // dims[0] % dims[1]),
            int(linear // (dims[0] * dims[1])))


class ArgTrace:
    """The accesses of one pointer argument: one row per (access, element it covered)."""

    def __init__(self, launch: LaunchTrace, name: str, shape: tuple, dtype, events):
        self.launch, self.name, self.shape = launch, name, tuple(shape)
        self.dtype = np.dtype(dtype)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        where = events["where"]
        offset, nbytes = where >> abi.TRACE_SIZE_BITS, where & _SIZE_MASK
        first = (offset // self.dtype.itemsize).astype(np.int64)
        n = ((offset + nbytes - 1) // self.dtype.itemsize).astype(np.int64) - first + 1
        starts = np.repeat(np.cumsum(n) - n, n)
        self.element = np.repeat(first, n) + np.arange(int(n.sum()), dtype=np.int64) - starts
        self.block = np.repeat(events["block"], n)
        self.thread = np.repeat(events["thread"], n)
        self.kind = np.repeat(events["kind"], n)
        self.accesses = len(events)  # events recorded for this argument

    def __repr__(self) -> str:
        return (f"<ArgTrace {self.name} {self.shape}: {self.accesses:,} accesses"
                f"{' (truncated)' if self.launch.truncated else ''}>")

    def _rows(self, kind: str, block=None, thread=None) -> np.ndarray:
        """Rows of accesses of `kind` ("read": reads and atomics, "write": writes and atomics,
        "atomic"), by `block` (and `thread`) if given."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        rows = self.kind == ATOMIC
        if kind != "atomic":
            rows |= self.kind == (READ if kind == "read" else WRITE)
        if thread is not None and block is None:
            raise ValueError("thread= names a thread of a block: give block= too")
        if block is not None:
            rows &= self.block == _linear(block, self.launch.grid, "block")
        if thread is not None:
            rows &= self.thread == _linear(thread, self.launch.block_dim, "thread")
        return rows

    def _flat(self, index) -> int:
        if isinstance(index, (int, np.integer)):
            flat = int(index)
        else:
            index = tuple(index)
            if len(index) != len(self.shape):
                raise ValueError(f"{self.name}: index {index} for an array of shape {self.shape}")
            flat = int(np.ravel_multi_index(index, self.shape))  # raises when out of range
        if not 0 <= flat < self.size:
            raise ValueError(f"{self.name}: element {flat} is outside its {self.size} elements")
        return flat

    def index(self, flat: int) -> tuple:
        """The element's index in the array's shape."""
        return tuple(int(i) for i in np.unravel_index(flat, self.shape))

    def label(self, index) -> str:
        """The element as a reader writes it: "O[3, 5]"."""
        return f"{self.name}[{', '.join(map(str, self.index(self._flat(index))))}]"

    def count(self, kind: str = "read", by: str = "block") -> np.ndarray:
        """An int array of the argument's shape: for each element, the distinct blocks (by
        "block"), distinct threads ((block, thread) pairs, "thread") or accesses ("access")
        that did `kind` to it."""
        if by not in BY:
            raise ValueError(f"by must be one of {', '.join(BY)}, got {by!r}")
        rows = self._rows(kind)
        elem = self.element[rows]
        if by != "access":
            who = self.block[rows].astype(np.int64)
            if by == "thread":
                who = who * abi.MAX_BLOCK_THREADS + self.thread[rows]
            order = np.lexsort((who, elem))  # by element, then by who: repeats side by side
            elem, who = elem[order], who[order]
            first = np.ones(elem.size, bool)
            first[1:] = (elem[1:] != elem[:-1]) | (who[1:] != who[:-1])
            elem = elem[first]
        return np.bincount(elem, minlength=self.size)[:self.size].reshape(self.shape)

    def mask(self, kind: str = "read", block=None, thread=None) -> np.ndarray:
        """A bool array of the argument's shape: the elements `block` (thread `thread` of it;
        anyone if None) did `kind` to."""
        out = np.zeros(self.size, bool)
        out[self.element[self._rows(kind, block, thread)]] = True
        return out.reshape(self.shape)

    def elements(self, kind: str = "read", block=None, thread=None) -> list[tuple]:
        """The indices of mask(kind, block, thread), in order."""
        return [tuple(int(i) for i in ix) for ix in np.argwhere(self.mask(kind, block, thread))]

    def _who(self, index, kind: str, by: str) -> list[tuple]:
        rows = self._rows(kind) & (self.element == self._flat(index))
        if by == "block":
            return [_unlinear(b, self.launch.grid) for b in np.unique(self.block[rows])]
        if by != "thread":
            raise ValueError(f"by must be 'block' or 'thread', got {by!r}")
        pairs = sorted(set(zip(self.block[rows].tolist(), self.thread[rows].tolist(), strict=True)))
        return [(_unlinear(b, self.launch.grid), _unlinear(t, self.launch.block_dim))
                for b, t in pairs]

    def readers(self, index, by: str = "thread") -> list[tuple]:
        """Who read element `index` (a flat int or a tuple): blockIdx tuples (by "block") or
        (blockIdx, threadIdx) pairs (by "thread"), sorted."""
        return self._who(index, "read", by)

    def writers(self, index, by: str = "thread") -> list[tuple]:
        """Who wrote element `index`, as readers() says who read it."""
        return self._who(index, "write", by)

    def block_map(self, kind: str = "write") -> np.ndarray:
        """An int array of the argument's shape: the linear index of the one block that did
        `kind` to each element, -1 where none did, -2 where several did."""
        rows = self._rows(kind)
        elem, blk = self.element[rows], self.block[rows].astype(np.int64)
        out = np.full(self.size, -1, np.int64)
        lo = np.full(self.size, np.iinfo(np.int64).max)
        hi = np.full(self.size, -1, np.int64)
        np.minimum.at(lo, elem, blk)
        np.maximum.at(hi, elem, blk)
        seen = hi >= 0
        out[seen] = np.where(lo[seen] == hi[seen], hi[seen], -2)
        return out.reshape(self.shape)

    def never_written(self) -> list[tuple]:
        """The indices of the elements no thread wrote (nor updated atomically), in order: a
        checker's "O[3, 5] was never written". A truncated trace cannot say: ValueError."""
        if self.launch.truncated:
            raise ValueError(f"{self.launch.kernel}: the trace was truncated after "
                             f"{self.launch.max_events:,} of {self.launch.total_events:,} "
                             f"accesses, so what was never written is unknown; trace again "
                             f"with emu.trace(max_events={self.launch.total_events})")
        return [tuple(int(i) for i in ix) for ix in np.argwhere(~self.mask("write"))]


class LaunchTrace:
    """The trace of one launch: `args` maps each pointer parameter's name to its ArgTrace."""

    def __init__(self, kernel: str, grid: tuple, block_dim: tuple, events: np.ndarray,
                 total_events: int, max_events: int, arrays: dict):
        self.kernel, self.grid, self.block_dim = kernel, tuple(grid), tuple(block_dim)
        self.events = events  # as recorded (several workers: interleaved), EVENT dtype
        self.total_events, self.max_events = int(total_events), int(max_events)
        self.truncated = self.total_events > self.max_events
        self.args = {name: ArgTrace(self, name, a.shape, a.dtype, events[events["arg"] == i])
                     for i, (name, a) in enumerate(arrays.items())}

    def __getitem__(self, name: str) -> ArgTrace:
        if name not in self.args:
            raise KeyError(f"{self.kernel} has no pointer argument {name!r}: it has "
                           f"{', '.join(self.args) or 'none'}")
        return self.args[name]

    def __repr__(self) -> str:
        cut = f", truncated at {self.max_events:,} of {self.total_events:,}" if self.truncated \
            else ""
        return f"<LaunchTrace {self.kernel}: {len(self.events):,} accesses{cut}>"

    def block_index(self, linear: int) -> tuple:
        """blockIdx (x, y, z) of a linear block index (x fastest)."""
        return _unlinear(linear, self.grid)

    def thread_index(self, linear: int) -> tuple:
        """threadIdx (x, y, z) of a linear thread index in a block (x fastest)."""
        return _unlinear(linear, self.block_dim)


# ---- what the launch path calls (loader.py) ---------------------------------------------------
def check_launch(s: config.Settings, kernel: str, grid: tuple) -> None:
    """A traced launch names each block with 32 bits (abi.h's EmuTraceEvent)."""
    blocks = grid[0] * grid[1] * grid[2]
    if s.trace and blocks > 1 << 32:
        raise ValueError(f"{kernel}: a traced launch may have at most 2**32 blocks, got "
                         f"{blocks:,}")


def buffer(s: config.Settings) -> np.ndarray | None:
    """The array the runtime writes a traced launch's events to (None: not traced). np.empty:
    its pages are touched only as events arrive."""
    return np.empty(s.trace_max_events, EVENT) if s.trace else None


def collect(buf: np.ndarray, total: int, kernel: str, grid: tuple, block: tuple,
            arrays: dict) -> LaunchTrace:
    """The launch's trace, from the first min(total, len(buf)) events of buf (copied: the
    buffer, sized for the cap, is freed)."""
    events = buf[:min(total, len(buf))].copy()
    return LaunchTrace(kernel, grid, block, events, total, len(buf), arrays)


class Tracing:
    """Every launch made inside a `with emu.trace()` block (`launches`, as emu.record() has
    them); `traces` those that were traced (a launch from another thread, with settings of its
    own, may not be), `last` the latest of them."""

    def __init__(self, recording: Recording):
        self.recording = recording

    @property
    def launches(self) -> list:
        return self.recording.launches

    @property
    def traces(self) -> list[LaunchTrace]:
        return [x.trace for x in self.launches if x.trace is not None]

    @property
    def last(self) -> LaunchTrace:
        if not self.traces:
            raise LookupError("no traced launch yet in this emu.trace() block (launches on "
                              "a GPU, through CuPy, are not traced)")
        return self.traces[-1]


@contextlib.contextmanager
def trace(max_events: int | None = None):
    """Trace every launch this thread makes inside the block, in counted mode whatever the mode
    around it (the trace is recorded by the counted build's hooks), at most `max_events`
    events a launch (default config.TRACE_MAX_EVENTS)."""
    changes = dict(trace=True, mode="counted")
    if max_events is not None:
        changes["trace_max_events"] = max_events
    with config.settings(**changes), record() as rec:
        yield Tracing(rec)
