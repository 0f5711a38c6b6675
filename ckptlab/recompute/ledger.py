"""The ledgers of the autograd engine: exact bytes of saved activations over time, and FLOPs.

Bytes: every array an op keeps for its backward is *acquired* when the op runs and *released*
when its backward has run. Arrays are counted by the buffer that owns their memory (a view
counts its base once), so two ops holding the same activation count it once. Parameters are
never counted: they are held whatever the schedule. The ledger is exact about what the graph
holds; the allocator's peak (measure.timing.peak_memory: tracemalloc / the CuPy pool) adds
gradients, parameters and temporaries on top.

FLOPs are counted by phase: "forward" and "backward" are the model FLOPs (useful work);
"recompute" is what checkpointing (and FlashAttention's backward, recomputing S = Q K^T) does
again. Hardware FLOPs = model FLOPs + recompute; MFU = model / (t * peak), HFU = hardware / (t *
peak): ckptlab.measure.roofline.utilization computes both.

Use it through the engine: `with ledger.record() as led: loss = model(...); loss.backward()`.
"""

from __future__ import annotations

import contextlib

from ckptlab.engine import tape
from ckptlab.engine.tape import PHASES


def root_buffer(a):
    """The object that owns the memory of array `a` (a view's base, followed to the end)."""
    while getattr(a, "base", None) is not None and hasattr(a.base, "nbytes"):
        a = a.base
    return a


class Ledger:
    """Saved-activation bytes alive at each moment (and the peak), and FLOPs by phase.

    `timeline=True` keeps (phase, bytes) after every acquire/release for plots; `labels=True`
    names every buffer by the op that made it (used by profile.profile to tell a block's input,
    output and internal buffers apart)."""

    def __init__(self, timeline: bool = True, labels: bool = False):
        self.bytes = 0  # saved bytes alive now
        self.peak = 0
        self.flops = {p: 0 for p in PHASES}
        self.events = [] if timeline else None  # (phase, bytes after the event)
        self.clock = [] if timeline else None  # hardware FLOPs done when each event happened
        self.checkpoints = 0  # buffers held by checkpoint nodes now (snapshots)
        self.peak_checkpoints = 0
        self._held = {}  # id(root) -> [root, refs, checkpoint refs]
        self.labeling = labels
        self.label_of = {}  # id(root) -> label (only with labels=True)
        self._keep = []  # labelled roots, kept so that their ids stay unique
        self.ops = 0  # ops seen (labels=True): the op counter behind the labels

    # ---------------------------------------------------------------------------- bytes
    def acquire(self, arrays, phase: str, kind: str = "saved") -> list:
        """Count `arrays` (arrays, or objects with .nbytes such as a kernel's saved state) as
        held; returns the keys to release later. kind="checkpoint" marks snapshot inputs."""
        keys = []
        for a in arrays:
            root = root_buffer(a)
            key = id(root)
            entry = self._held.get(key)
            if entry is None:
                entry = self._held[key] = [root, 0, 0]
                self.bytes += int(root.nbytes)
                if self.labeling and key not in self.label_of:
                    self._name(root, f"{self.ops - 1}.{len(self.label_of)}")
            entry[1] += 1
            if kind == "checkpoint":
                entry[2] += 1
                if entry[2] == 1:
                    self.checkpoints += 1
                    self.peak_checkpoints = max(self.peak_checkpoints, self.checkpoints)
            keys.append((key, kind == "checkpoint"))
        self.peak = max(self.peak, self.bytes)
        if keys and self.events is not None:
            self._event(phase)
        return keys

    def _event(self, phase: str) -> None:
        self.events.append((phase, self.bytes))
        self.clock.append(sum(self.flops.values()))

    def release(self, keys, phase: str) -> None:
        """Undo one acquire: buffers whose last holder went are no longer counted."""
        for key, is_ckpt in keys:
            entry = self._held[key]
            entry[1] -= 1
            if is_ckpt:
                entry[2] -= 1
                if entry[2] == 0:
                    self.checkpoints -= 1
            if entry[1] == 0:
                self.bytes -= int(entry[0].nbytes)
                del self._held[key]
        if keys and self.events is not None:
            self._event(phase)

    # ---------------------------------------------------------------------------- labels
    def _name(self, root, label: str) -> None:
        self.label_of[id(root)] = label
        self._keep.append(root)

    def label(self, array, label: str) -> None:
        """Name the buffer of `array` (if it has no name yet)."""
        root = root_buffer(array)
        if id(root) not in self.label_of:
            self._name(root, label)

    def on_op(self, out) -> None:
        """Called by the engine for every op's output: a new buffer is named by the op's index."""
        self.ops += 1
        if self.labeling:
            self.label(out, str(self.ops - 1))

    def rename(self, array, label: str) -> None:
        """Name the buffer of `array` `label`, replacing any name it had."""
        root = root_buffer(array)
        if id(root) not in self.label_of:
            self._keep.append(root)
        self.label_of[id(root)] = label

    def held_by_label(self) -> dict:
        """{label: bytes} of the buffers held now (labels=True)."""
        return {self.label_of.get(k, f"?{k}"): int(e[0].nbytes) for k, e in self._held.items()}

    # ---------------------------------------------------------------------------- flops
    def add_flops(self, n, phase: str) -> None:
        self.flops[phase] += int(n)

    @property
    def model_flops(self) -> int:
        """Useful work: forward + backward, counted once."""
        return self.flops["forward"] + self.flops["backward"]

    @property
    def hardware_flops(self) -> int:
        """What the machine executed: model FLOPs plus every recompute."""
        return self.model_flops + self.flops["recompute"]

    def flops_clock(self) -> list:
        """Hardware FLOPs done (forward, recompute and backward so far) at each timeline event:
        one clock for every schedule of the same model, on which recompute takes its time."""
        return list(self.clock or [])

    def timeline(self):
        """(bytes after each event, phase spans [(start, end, phase)]) for plots.memory_trace."""
        events = self.events or []
        values = [b for _, b in events]
        spans, start = [], 0
        for k in range(1, len(events) + 1):
            if k == len(events) or events[k][0] != events[start][0]:
                spans.append((start, k, events[start][0]))
                start = k
        return values, spans

    def summary(self) -> dict:
        return {
            "peak_saved_bytes": self.peak,
            "saved_bytes_now": self.bytes,
            "peak_checkpoints": self.peak_checkpoints,
            "model_flops": self.model_flops,
            "hardware_flops": self.hardware_flops,
            **{f"{p}_flops": v for p, v in self.flops.items()},
        }


@contextlib.contextmanager
def record(led: Ledger | None = None, **kwargs):
    """Install a Ledger in the engine for the duration of the block; yields it."""
    led = Ledger(**kwargs) if led is None else led
    previous = tape.set_ledger(led)
    try:
        yield led
    finally:
        tape.set_ledger(previous)
