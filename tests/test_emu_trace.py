"""The access trace on small kernels whose every access is known by hand: who read and wrote
each element, what one block or thread touched, what was never written; its cap, its bounds,
its workers, fast mode, atomics, and counts that are the same with the trace on as off."""

import re
from dataclasses import astuple

import numpy as np
import pytest

from ckptlab import cdefs, emu
from ckptlab.emu import abi, tracing

pytestmark = pytest.mark.counted  # byte counts, bounds and race checks

SRC = r"""
extern "C" __global__ void copy(const float* x, float* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
extern "C" __global__ void copy_but(const float* x, float* y, int n, int skip) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && i != skip) y[i] = x[i];          // one element left as it was
}
extern "C" __global__ void past_the_end(const float* x, float* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) y[i] = x[i < n ? i : 0];          // i == n: one past y's end
}
extern "C" __global__ void histogram(const int* v, int* hist, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&hist[v[i] % 4], 1);     // reads and writes hist[...]
}
struct Big { float v[20000]; };                   // 80,000 bytes: one range access
extern "C" __global__ void big_copy(const float* x, float* y) {
    *reinterpret_cast<Big*>(y) = *reinterpret_cast<const Big*>(x);
}
extern "C" __global__ void racy(float* x) {
    x[0] = threadIdx.x;                           // every thread writes x[0], no barrier
}
"""


@pytest.fixture(scope="module")
def mod():
    return emu.RawModule(code=SRC, name="trace.cu")


def counts(launch):
    return ({n: astuple(a) for n, a in launch.args.items()}, launch.shared_read_bytes,
            launch.shared_write_bytes, launch.threads, launch.blocks)


@pytest.mark.parametrize("race_check", [False, True])
def test_copy_each_element_by_its_own_thread(mod, race_check):
    n, bs = 37, 16  # 3 blocks, the last one mostly idle
    x, y = np.arange(n, dtype=np.float32), np.full(n, np.nan, np.float32)
    with emu.settings(race_check=race_check), emu.trace() as tr:
        mod.get_function("copy")((3,), (bs,), (x, y, np.int32(n)))
    assert np.array_equal(x, y)
    t = tr.last
    assert not t.truncated and t.total_events == len(t.events) == 2 * n
    for name, kind in (("x", "read"), ("y", "write")):
        a = t[name]
        assert a.shape == (n,) and a.accesses == n
        for by in ("block", "thread", "access"):
            assert (a.count(kind, by=by) == 1).all()
        assert (a.count("write" if kind == "read" else "read") == 0).all()
        assert np.array_equal(a.block_map(kind), np.arange(n) // bs)
        for i in (0, 15, 16, 36):
            assert (a.readers(i) if kind == "read" else a.writers(i)) == [
                ((i // bs, 0, 0), (i % bs, 0, 0))]
        assert a.elements(kind, block=1) == [(i,) for i in range(16, 32)]
        assert a.elements(kind, block=2, thread=(4,)) == [(36,)]
        assert a.elements(kind, block=2, thread=5) == []  # thread 5 of block 2: i = 37 >= n
    assert t["y"].never_written() == []
    assert t["x"].never_written() == [(i,) for i in range(n)]  # read, never written


def test_never_written_names_the_skipped_element(mod):
    y = np.full((5, 7), np.nan, np.float32)
    x = np.ones((5, 7), np.float32)
    with emu.trace() as tr:
        mod.get_function("copy_but")((3,), (16,), (x, y, np.int32(35), np.int32(3 * 7 + 5)))
    a = tr.last["y"]
    assert a.never_written() == [(3, 5)] and np.isnan(y[3, 5])
    assert a.label((3, 5)) == a.label(26) == "y[3, 5]"
    assert a.writers((3, 5)) == [] and a.readers((3, 5)) == []
    assert a.block_map()[3, 5] == -1 and a.count("write")[3, 5] == 0
    with pytest.raises(ValueError, match="shape"):
        a.writers((3,))
    with pytest.raises(ValueError, match="outside"):
        a.readers(35)


def test_counts_with_the_trace_equal_counts_without(mod):
    n = 1000
    x, y = np.ones(n, np.float32), np.zeros(n, np.float32)
    f = mod.get_function("copy")
    for race_check in (False, True):
        with emu.settings(race_check=race_check):
            plain = f((8,), (128,), (x, y, np.int32(n)))
            with emu.trace():
                traced = f((8,), (128,), (x, y, np.int32(n)))
            after = f((8,), (128,), (x, y, np.int32(n)))  # the trace leaves nothing behind
        assert plain.trace is None and after.trace is None and traced.trace is not None
        assert counts(plain) == counts(traced) == counts(after)


def test_cap_truncates_and_says_so(mod):
    n = 37
    x, y = np.arange(n, dtype=np.float32), np.full(n, np.nan, np.float32)
    f = mod.get_function("copy")
    untraced = f((3,), (16,), (x, y, np.int32(n)))
    y[:] = np.nan
    for workers in (1, 2):
        with emu.settings(workers=workers), emu.trace(max_events=50) as tr:
            launch = f((3,), (16,), (x, y, np.int32(n)))
        t = tr.last
        assert launch.workers == workers
        assert t.truncated and (t.max_events, t.total_events, len(t.events)) == (50, 74, 50)
        assert np.array_equal(x, y)  # the kernel ran on to the end
        assert counts(launch) == counts(untraced)
        assert sum(a.accesses for a in t.args.values()) == 50
        with pytest.raises(ValueError, match=r"truncated after 50 of 74.*max_events=74"):
            t["y"].never_written()
        assert "truncated" in repr(t) and "truncated" in repr(t["y"])
    with emu.trace(max_events=74) as tr:
        f((3,), (16,), (x, y, np.int32(n)))
    assert not tr.last.truncated and tr.last["y"].never_written() == []


def test_an_out_of_bounds_access_still_faults(mod):
    n = 20
    f = mod.get_function("past_the_end")
    messages = []
    for traced in (False, True):
        x, y = np.ones(n, np.float32), np.zeros(n, np.float32)
        with emu.settings(trace=traced), pytest.raises(emu.EmuError) as e:
            f((1,), (32,), (x, y, np.int32(n)))
        assert e.value.kind == "access" and e.value.block == (0, 0, 0)
        assert e.value.thread == (n, 0, 0)
        messages.append(re.sub(r"0x[0-9a-f]+", "ADDRESS", str(e.value)))  # (staging moves)
    assert "out-of-bounds write" in messages[0] and messages[0] == messages[1]


def test_a_race_is_still_found(mod):
    with emu.settings(race_check=True), emu.trace(), pytest.raises(emu.EmuError) as e:
        mod.get_function("racy")((1,), (32,), (np.zeros(1, np.float32),))
    assert e.value.kind == "race"


def test_two_workers_record_the_same_accesses(mod):
    n = 64 * 40
    x = np.arange(n, dtype=np.float32)
    events = []
    for workers in (1, 2):
        y = np.zeros(n, np.float32)
        with emu.settings(workers=workers), emu.trace() as tr:
            launch = mod.get_function("copy")((40,), (64,), (x, y, np.int32(n)))
        assert launch.workers == workers and np.array_equal(x, y)
        events.append(np.sort(tr.last.events, order=["arg", "block", "thread", "where"]))
        assert np.array_equal(tr.last["y"].block_map(), np.arange(n) // 64)
    assert np.array_equal(events[0], events[1])


def test_an_atomic_reads_and_writes(mod):
    v = np.arange(10, dtype=np.int32)  # bins 0, 1, 2, 3 get 3, 3, 2, 2 values
    hist = np.zeros(4, np.int32)
    with emu.trace() as tr:
        mod.get_function("histogram")((1,), (16,), (v, hist, np.int32(10)))
    assert hist.tolist() == [3, 3, 2, 2]
    h = tr.last["hist"]
    assert h.count("atomic", by="access").tolist() == [3, 3, 2, 2]
    assert np.array_equal(h.count("read", by="thread"), h.count("write", by="thread"))
    assert h.count("read", by="thread").tolist() == [3, 3, 2, 2]
    assert h.readers(2) == h.writers(2) == [((0, 0, 0), (t, 0, 0)) for t in (2, 6)]
    assert set(tr.last.events["kind"][tr.last.events["arg"] == 1]) == {tracing.ATOMIC}
    assert tr.last["v"].never_written() == [(i,) for i in range(10)]


def test_a_range_access_is_split_and_covers_every_element(mod):
    x, y = np.arange(20000, dtype=np.float32), np.zeros(20000, np.float32)
    with emu.trace() as tr:
        mod.get_function("big_copy")((1,), (1,), (x, y))
    assert np.array_equal(x, y)
    for name, kind in (("x", "read"), ("y", "write")):
        a = tr.last[name]
        assert a.accesses == 3  # 32768 + 32768 + 14464 bytes
        assert (a.count(kind, by="access") == 1).all()


def test_fast_mode(mod):
    with pytest.raises(ValueError, match="trace=True needs mode='counted'"):
        with emu.settings(mode="fast", trace=True):
            pass
    n = 5
    x, y = np.ones(n, np.float32), np.zeros(n, np.float32)
    f = mod.get_function("copy")
    with emu.settings(mode="fast"):
        with emu.trace() as tr:  # switches its block to counted
            launch = f((1,), (8,), (x, y, np.int32(n)))
            with pytest.raises(ValueError, match="needs mode='counted'"):
                with emu.settings(mode="fast"):
                    pass
        assert launch.mode == "counted" and launch.trace is tr.last
        assert f((1,), (8,), (x, y, np.int32(n))).mode == "fast"


def test_settings_and_last_launch(mod):
    n = 5
    x, y = np.ones(n, np.float32), np.zeros(n, np.float32)
    with emu.settings(trace=True, trace_max_events=3):
        mod.get_function("copy")((1,), (8,), (x, y, np.int32(n)))
    t = emu.last_launch().trace
    assert t.truncated and len(t.events) == 3 and t.total_events == 2 * n
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="trace_max_events"):
            emu.settings(trace_max_events=bad).__enter__()
    with pytest.raises(ValueError, match="trace must be True or False"):
        emu.settings(trace=1).__enter__()


def test_queries_check_their_arguments(mod):
    n = 5
    x, y = np.ones(n, np.float32), np.zeros(n, np.float32)
    with emu.trace() as tr:
        mod.get_function("copy")((2,), (4,), (x, y, np.int32(n)))
    a = tr.last["x"]
    with pytest.raises(ValueError, match=r"block \(2, 0, 0\) is outside"):
        a.mask(block=2)
    with pytest.raises(ValueError, match="give block="):
        a.mask(thread=0)
    with pytest.raises(ValueError, match="kind must be"):
        a.count("written")
    with pytest.raises(ValueError, match="by must be"):
        a.count(by="warp")
    with pytest.raises(KeyError, match="no pointer argument 'z'"):
        tr.last["z"]
    with pytest.raises(LookupError, match="no traced launch"):
        with emu.trace() as empty:
            _ = empty.last


def test_the_event_layout_is_abi_hs():
    """The kinds and the size field come from abi.h; the NumPy view of an event is the ctypes
    mirror's, which every built module's layout is checked against (tests/test_constants.py)."""
    c = cdefs.read(abi.HEADER)
    assert abi.ACCESS_KINDS == {c["EMU_ACCESS_READ"]: "read", c["EMU_ACCESS_WRITE"]: "write",
                                c["EMU_ACCESS_ATOMIC"]: "atomic"}
    assert (tracing.READ, tracing.WRITE, tracing.ATOMIC) == (0, 1, 2)  # the hooks' kind codes
    assert tracing.EVENT.itemsize == 16 and abi.TRACE_SIZE_BITS == c["EMU_TRACE_SIZE_BITS"]
    assert "TraceEvent.where@0+8" in abi.layout() and "TraceEvent.kind@15+1" in abi.layout()
    for name, _ in abi.TraceEvent._fields_:
        assert tracing.EVENT.fields[name][1] == getattr(abi.TraceEvent, name).offset
