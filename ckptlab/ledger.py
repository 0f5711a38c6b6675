"""The ledgers of the autograd engine: exact bytes of saved activations over time, and FLOPs.

Bytes: every array an op keeps for its backward is *acquired* when the op runs and *released*
when its backward has run. Arrays are counted by the buffer that owns their memory (a view
counts its base once), so two ops holding the same activation count it once. Parameters are
never counted: they are held whatever the schedule. The ledger is exact about what the graph
holds; the allocator's peak (measure.peak_memory: tracemalloc / the CuPy pool) adds gradients,
parameters and temporaries on top.

FLOPs are counted by phase: "forward" and "backward" are the model FLOPs (useful work);
"recompute" is what checkpointing (and FlashAttention's backward, recomputing S = Q K^T) does
again. Hardware FLOPs = model FLOPs + recompute; MFU = model / (t * peak), HFU = hardware / (t *
peak).

Use it through the engine: `with ledger.record() as led: loss = model(...); loss.backward()`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

PHASES = ("forward", "recompute", "backward")


def root_buffer(a):
    """The object that owns the memory of array `a` (a view's base, followed to the end)."""
    while getattr(a, "base", None) is not None and hasattr(a.base, "nbytes"):
        a = a.base
    return a


class Ledger:
    """Saved-activation bytes alive at each moment (and the peak), and FLOPs by phase.

    `timeline=True` keeps (phase, bytes) after every acquire/release for plots; `labels=True`
    names every buffer by the op that made it (used by schedules.profile to tell a block's input,
    output and internal buffers apart)."""

    def __init__(self, timeline: bool = True, labels: bool = False):
        self.bytes = 0  # saved bytes alive now
        self.peak = 0
        self.flops = {p: 0 for p in PHASES}
        self.events = [] if timeline else None  # (phase, bytes after the event)
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
            self.events.append((phase, self.bytes))
        return keys

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
            self.events.append((phase, self.bytes))

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
    from ckptlab import autograd

    led = Ledger(**kwargs) if led is None else led
    previous = autograd.set_ledger(led)
    try:
        yield led
    finally:
        autograd.set_ledger(previous)


# -------------------------------------------------------------------------- profiles


@dataclass
class StageProfile:
    """What one stage (block) of a chain saves and computes, measured by running it once.

    saved: {label: bytes} held after a forward with grad; "in" is the stage's input, "out" its
    output, other labels name buffers made inside (by op index). stored: per selective policy,
    {label: bytes} of the op outputs a selective checkpoint keeps. FLOPs: forward, backward,
    recompute done inside backward (flash attention), and per policy the forward FLOPs a
    selective recompute skips."""

    in_bytes: int
    out_bytes: int
    saved: dict
    fwd_flops: int
    bwd_flops: int
    bwd_recompute_flops: int
    stored: dict = field(default_factory=dict)
    replayed_flops: dict = field(default_factory=dict)


@dataclass
class Profile:
    """A chain of stages: `first` stages before the blocks and any after them run plainly;
    blocks first .. first + n_blocks - 1 are what a schedule arranges."""

    stages: list
    first: int
    n_blocks: int

    @property
    def fixed(self) -> list:
        return [not self.first <= i < self.first + self.n_blocks for i in range(len(self.stages))]


def profile(stages, x, first: int = 0, n_blocks: int | None = None, policies=()) -> Profile:
    """Run each stage once on its real input (the previous stage's output) under a labelling
    ledger, forward and backward, and record a StageProfile; with `policies`, also once under a
    selective checkpoint per policy. The dropout RNG state is restored afterwards."""
    from ckptlab import autograd
    from ckptlab.checkpoint import checkpoint, resolve_policy

    policies = [resolve_policy(p) for p in policies]
    n_blocks = len(stages) - first if n_blocks is None else n_blocks
    if not (0 <= first and n_blocks >= 1 and first + n_blocks <= len(stages)):
        raise ValueError(f"profile: blocks {first}..{first + n_blocks - 1} do not fit in "
                         f"{len(stages)} stages")
    state, out = autograd.rng_state(), []

    def run(stage, x, policy):
        t = x.detach(requires_grad=x.requires_grad)  # an activation leaf, never a parameter
        led = Ledger(timeline=False, labels=True)
        led.rename(t.data, "in")
        with record(led):
            y = checkpoint(stage, t, policy=policy) if policy else stage(t)
            led.rename(y.data, "out")
            held = led.held_by_label()
            if y.requires_grad:
                y.backward(autograd.xp_of(y.data).ones_like(y.data))
        return y, held, led.flops

    try:
        for stage in stages:
            y, saved, flops = run(stage, x, None)
            prof = StageProfile(int(x.data.nbytes), int(y.data.nbytes), saved,
                                flops["forward"], flops["backward"], flops["recompute"])
            for policy in policies:
                _, held, f = run(stage, x, policy)
                prof.stored[policy] = {k: b for k, b in held.items() if k != "in"}
                recomputed = f["recompute"] - prof.bwd_recompute_flops
                prof.replayed_flops[policy] = prof.fwd_flops - recomputed
            out.append(prof)
            x = y.detach(requires_grad=y.requires_grad)
    finally:
        autograd.set_rng_state(state)
    return Profile(out, first, n_blocks)


# -------------------------------------------------------------------------- utilization


def _peak(peak_flops_per_s, device_name, dtype) -> float:
    if peak_flops_per_s is not None:
        peak = float(peak_flops_per_s)
        if not peak > 0:
            raise ValueError(f"peak_flops_per_s: expected a positive number, got {peak}")
        return peak
    if device_name is None:
        raise ValueError("give peak_flops_per_s (a number) or device (a name in roofline's table)")
    from ckptlab import roofline

    return roofline.peak_flops(device_name, dtype)


def mfu(model_flops, seconds, peak_flops_per_s=None, *, device=None, dtype="fp32") -> float:
    """Model FLOPs utilization = model FLOPs / (seconds * peak FLOP/s): recompute not credited."""
    if not seconds > 0:
        raise ValueError(f"seconds: expected a positive time, got {seconds}")
    return float(model_flops) / seconds / _peak(peak_flops_per_s, device, dtype)


def hfu(hardware_flops, seconds, peak_flops_per_s=None, *, device=None, dtype="fp32") -> float:
    """Hardware FLOPs utilization = (model + recompute FLOPs) / (seconds * peak FLOP/s)."""
    return mfu(hardware_flops, seconds, peak_flops_per_s, device=device, dtype=dtype)
