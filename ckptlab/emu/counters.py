"""What the emulator counted in each launch, and how to collect it.

    with emu.record() as rec:
        mod.get_function("sgemm")(grid, block, (A, B, C, M, N, K))
    rec.launches[0].args["A"].read_bytes      # bytes the threads loaded from A
    rec.global_read_bytes                     # summed over every launch in the block

Counted bytes are the bytes each thread *requests* from each pointer argument, as the source
says (a float4 load is 16 bytes). No cache is modelled: on a GPU, L2 may serve some of them, so
Nsight Compute's measured DRAM bytes can be lower. An atomic counts one op and its size in
atomic_bytes, not in read/write bytes.

Unique bytes are the distinct bytes of each argument a launch read and wrote (an atomic counts
as both): what a cache as big as the data would move, the lower bound beside counted requests
(an upper bound). Measured DRAM bytes land between the two. Summed over launches (by_kernel,
Recording), unique bytes are a sum of per-launch figures, not a union.
"""

from __future__ import annotations

import contextlib
from dataclasses import astuple, dataclass, field


@dataclass(frozen=True)
class ArgTraffic:
    """Global-memory traffic of one pointer argument in one launch."""

    read_bytes: int = 0      # counted: bytes the threads requested
    write_bytes: int = 0
    atomic_ops: int = 0
    atomic_bytes: int = 0
    unique_read_bytes: int = 0   # unique: distinct bytes read (atomics included)
    unique_write_bytes: int = 0  # unique: distinct bytes written (atomics included)

    def __add__(self, other: ArgTraffic) -> ArgTraffic:
        return ArgTraffic(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))


@dataclass
class Launch:
    """One kernel launch on the emulator: its shape, time and (mode "counted") its traffic."""

    kernel: str
    module: str
    grid: tuple
    block: tuple
    shared_mem: int
    mode: str
    seconds: float
    threads: int = 0
    blocks: int = 0
    workers: int = 0  # OS threads that ran its blocks
    args: dict = field(default_factory=dict)  # parameter name -> ArgTraffic (pointers only)
    shared_read_bytes: int = 0
    shared_write_bytes: int = 0
    shared_atomics: int = 0
    trace: object = None  # with settings(trace=True): its LaunchTrace (tracing.py), else None

    @property
    def counted(self) -> bool:
        return self.mode == "counted"

    @property
    def global_read_bytes(self) -> int:
        return sum(a.read_bytes for a in self.args.values())

    @property
    def global_write_bytes(self) -> int:
        return sum(a.write_bytes for a in self.args.values())

    @property
    def atomic_ops(self) -> int:
        return sum(a.atomic_ops for a in self.args.values())

    @property
    def global_unique_read_bytes(self) -> int:
        return sum(a.unique_read_bytes for a in self.args.values())

    @property
    def global_unique_write_bytes(self) -> int:
        return sum(a.unique_write_bytes for a in self.args.values())

    @property
    def global_unique_bytes(self) -> int:
        """Distinct bytes read plus distinct bytes written: what an infinite cache would move."""
        return self.global_unique_read_bytes + self.global_unique_write_bytes

    @property
    def atomic_bytes(self) -> int:
        return sum(a.atomic_bytes for a in self.args.values())

    def table(self) -> str:
        """A readable per-argument table of this launch's global traffic."""
        rows = [f"{self.kernel}  grid={self.grid} block={self.block} ({self.mode}, "
                f"{self.seconds * 1e3:.1f} ms, {self.threads} threads)"]
        if not self.counted:
            return rows[0] + "\n  (not counted: mode 'fast' runs without the memory hooks)"
        rows.append(f"  {'argument':<12}{'read B':>14}{'written B':>14}{'atomics':>10}"
                    f"{'unique read B':>15}{'unique wr. B':>14}")
        for name, a in self.args.items():
            rows.append(f"  {name:<12}{a.read_bytes:>14,}{a.write_bytes:>14,}{a.atomic_ops:>10,}"
                        f"{a.unique_read_bytes:>15,}{a.unique_write_bytes:>14,}")
        rows.append(f"  {'shared':<12}{self.shared_read_bytes:>14,}{self.shared_write_bytes:>14,}"
                    f"{self.shared_atomics:>10,}")
        rows.append("  (read/written: counted requests, an upper bound; unique: distinct bytes, "
                    "a lower bound)")
        return "\n".join(rows)


class Recording:
    """Every launch made inside a `with emu.record()` block, in order."""

    def __init__(self):
        self.launches: list[Launch] = []

    def _sum(self, attr: str) -> int:
        return sum(getattr(x, attr) for x in self.launches)

    @property
    def global_read_bytes(self) -> int:
        return self._sum("global_read_bytes")

    @property
    def global_write_bytes(self) -> int:
        return self._sum("global_write_bytes")

    @property
    def atomic_bytes(self) -> int:
        return self._sum("atomic_bytes")

    @property
    def global_unique_read_bytes(self) -> int:
        return self._sum("global_unique_read_bytes")

    @property
    def global_unique_write_bytes(self) -> int:
        return self._sum("global_unique_write_bytes")

    @property
    def global_unique_bytes(self) -> int:
        """Sum over launches of each launch's unique bytes (read + written)."""
        return self._sum("global_unique_bytes")

    @property
    def seconds(self) -> float:
        return sum(x.seconds for x in self.launches)

    def by_kernel(self) -> dict:
        """kernel name -> {parameter name -> ArgTraffic}, summed over launches of that kernel."""
        out: dict = {}
        for x in self.launches:
            per = out.setdefault(x.kernel, {})
            for name, a in x.args.items():
                per[name] = per.get(name, ArgTraffic()) + a
        return out

    def table(self) -> str:
        return "\n\n".join(x.table() for x in self.launches)


_last: Launch | None = None
_active: list[Recording] = []


def last_launch() -> Launch | None:
    """The most recent launch in this process (None before the first)."""
    return _last


@contextlib.contextmanager
def record():
    """Collect every launch made inside the block (nested recordings each see them all)."""
    rec = Recording()
    _active.append(rec)
    try:
        yield rec
    finally:
        _active.remove(rec)


def _publish(launch: Launch) -> None:
    global _last
    _last = launch
    for rec in _active:
        rec.launches.append(launch)
