"""The CUDA-event timer (measure.timing._time_cuda) on a simulated GPU, no GPU needed: a
stand-in CuPy module whose one stream runs queued work in order, a launch starting when it is
queued and the work before it has ended, as CUDA's does. It shows that the timer holds the
stream while fn is queued (so the host's Python is not timed), in which order it calls CuPy, and
that a fn which waits for the GPU is flagged. The real thing runs in test_measure.py, -m gpu."""

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest

from ckptlab.measure import timing


class SimStream:
    """One CUDA stream on a simulated clock. The host clock moves only when the test says so
    (host_work); the stream's ops get start and end times when the host synchronises."""

    def __init__(self):
        self.host = 0.0  # seconds, the host's clock
        self.ops = []  # [kind, queued_at, duration or payload]
        self.log = []  # what the host asked for, in order
        self.flags = {}  # address -> ctypes array, the pinned allocations
        self.blind = False  # True: the device never sees the host's writes to mapped memory

    def queue(self, kind, payload=None):
        self._watch_release()
        self.log.append(kind if kind != "event" else f"record {payload.name}")
        self.ops.append([kind, self.host, payload])

    def _watch_release(self):
        """Notice the host's write of flag[0] (the release) at the next CuPy call."""
        for op in self.ops:
            if self.blind:
                break
            if op[0] == "hold" and op[2]["released"] is None and self.flags[op[2]["ptr"]][0]:
                op[2]["released"] = self.host
                self.log.append("release")

    def synchronize(self):
        self._watch_release()
        self.log.append("synchronize")
        t = 0.0
        for kind, queued, payload in self.ops:
            t = max(t, queued)
            if kind == "hold":
                if payload["released"] is None:  # never released: the guard lets it go
                    payload["released"] = t + payload["guard_s"]
                    self.flags[payload["ptr"]][1] = 1
                t = max(t, payload["released"])
            elif kind == "event":
                payload.at = t
            else:
                t += payload
        self.host = max(self.host, t)
        self.ops = []


def fake_cupy(sim: SimStream, l2_bytes=60_000_000):
    def host_alloc(size, flags):
        assert flags & runtime.hostAllocMapped, "the device must see the flag: mapped memory"
        buf = (ctypes.c_int32 * (size // 4))()
        sim.flags[ctypes.addressof(buf)] = buf
        return ctypes.addressof(buf)

    runtime = SimpleNamespace(
        hostAllocMapped=2, hostAllocPortable=1, hostAlloc=host_alloc,
        freeHost=lambda ptr: sim.flags.pop(ptr),
        getDeviceProperties=lambda i: {"name": b"Simulated GPU", "l2CacheSize": l2_bytes},
    )

    class Event:
        count = 0

        def __init__(self):
            self.name, self.at = ("start", "end")[Event.count % 2], None
            Event.count += 1

        def record(self):
            sim.queue("event", self)

        def synchronize(self):
            sim.synchronize()

    class RawKernel:
        def __init__(self, code, name):
            assert name in code and "globaltimer" in code
            self.name = name

        def __call__(self, grid, block, args):
            assert grid == (1,) and block == (1,)
            ptr, guard_ns = (int(a) for a in args)
            assert ptr in sim.flags, "the kernel must get the address the host writes"
            sim.queue("hold", {"ptr": ptr, "guard_s": guard_ns / 1e9, "released": None})

    def empty(n, dtype):
        return SimpleNamespace(nbytes=n * np.dtype(dtype).itemsize,
                               fill=lambda v: sim.queue("flush", FLUSH_S))

    cuda = SimpleNamespace(
        runtime=runtime, Event=Event,
        Device=lambda: SimpleNamespace(id=0, synchronize=sim.synchronize),
        get_elapsed_time=lambda a, b: (b.at - a.at) * 1e3,
    )
    return SimpleNamespace(cuda=cuda, RawKernel=RawKernel, empty=empty, uint8=np.uint8)


HOST_S, KERNEL_S = 50e-6, 5e-6  # fn: 50 us of Python, then one 5 us kernel
FLUSH_S = 1e-6  # the L2 flush's run time on the simulated stream


def make_fn(sim):
    def fn():
        sim.host += HOST_S  # checks, allocation, the launch itself
        sim.queue("fn", KERNEL_S)

    return fn


def test_the_held_stream_times_the_kernel_not_the_host():
    sim = SimStream()
    samples, label, how = timing._time_cuda(make_fn(sim), 5, 2, True, cp=fake_cupy(sim))
    assert samples == pytest.approx([KERNEL_S] * 5)
    assert label == "cuda: Simulated GPU" and "host time excluded" in how
    assert "L2 flushed" in how and "120.0 MB" in how  # twice the 60 MB L2
    assert not sim.flags, "the pinned flag was not freed"


def test_without_the_hold_the_host_is_timed():
    """What the hold fixes: the start event fires at once, the kernel only when queued."""
    sim = SimStream()
    samples, _, how = timing._time_cuda(make_fn(sim), 5, 2, True, hold_stream=False,
                                        cp=fake_cupy(sim))
    # the start event fires when the flush ends, 1 us into fn's 50 us of host work
    assert samples == pytest.approx([HOST_S - FLUSH_S + KERNEL_S] * 5)
    assert "host time between launches included" in how


def test_the_calls_come_in_the_order_that_excludes_the_host():
    sim = SimStream()
    timing._time_cuda(make_fn(sim), 3, 1, True, cp=fake_cupy(sim))
    first = sim.log.index("flush")
    timed = sim.log[first:]
    per_repeat = ["flush", "hold", "record start", "fn", "record end", "release", "synchronize"]
    assert timed == per_repeat * 3 + ["synchronize"], timed
    # before: the hold kernel launched (compiled) and released once, then the warm-up call
    assert sim.log[:first] == ["hold", "release", "fn", "synchronize"]


def test_a_fn_that_waits_for_the_gpu_is_flagged():
    """A fn that synchronises while the stream is held can only go on when the guard lets the
    stream go: each such repeat is counted and said to include host time."""
    sim = SimStream()

    def waits():
        sim.host += HOST_S
        sim.queue("fn", KERNEL_S)
        sim.synchronize()  # e.g. a .get() inside fn

    samples, _, how = timing._time_cuda(waits, 4, 1, False, cp=fake_cupy(sim))
    assert "except in 4 repeat(s)" in how and "include host time" in how
    assert len(samples) == 4 and "L2 flushed" not in how


def test_a_gpu_blind_to_the_release_falls_back_to_host_driven_timing():
    """If the device cannot see the host's write (mapped memory not working), the first hold,
    released at once, still ends by its guard: the timer says so and stops holding, instead of
    paying the guard on every repeat."""
    sim = SimStream()
    sim.blind = True
    samples, _, how = timing._time_cuda(make_fn(sim), 5, 1, True, cp=fake_cupy(sim))
    assert "stream hold was unavailable" in how and "host-driven" in how
    assert samples == pytest.approx([HOST_S - FLUSH_S + KERNEL_S] * 5)
    assert sim.log.count("hold") == 1 and not sim.flags


def test_the_stream_is_released_when_fn_raises():
    sim = SimStream()
    calls = []

    def boom():
        calls.append(1)
        if len(calls) > 1:  # the warm-up call passes, the first timed one raises
            raise ValueError("bad shape")

    with pytest.raises(ValueError, match="bad shape"):
        timing._time_cuda(boom, 3, 1, True, cp=fake_cupy(sim))
    assert sim.log[-2:] == ["release", "synchronize"] and not sim.flags


def test_the_hold_kernel_compiles_for_hopper(tmp_path):
    """The inline PTX (%globaltimer) and the mapped-pointer cast, through NVIDIA's compiler."""
    from ckptlab.kernels import nvrtc

    if not nvrtc.backend_available("nvrtc"):
        pytest.skip("NVRTC is not installed here (pip install nvidia-cuda-nvrtc-cu12)")
    src = tmp_path / "hold.cu"
    src.write_text(timing._HOLD_SOURCE)
    records = nvrtc.compile_file(src, arch="sm_90", backend="nvrtc", instantiations=())
    assert [r["kernel"] for r in records] == ["ckptlab_hold_stream"]
    assert records[0]["lmem"] == 0  # no spills or local arrays in a one-thread spin
