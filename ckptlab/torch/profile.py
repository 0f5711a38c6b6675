"""A ckptlab Profile of a chain of torch modules, measured from what autograd saves.

ckptlab's budgeted schedules (optimal, chen_greedy) and every prediction (Schedule.predict)
read a recompute.profile.Profile: per stage, the bytes its forward saves by buffer ("in" its
input, "out" its output, other labels the storages made inside), its forward and backward
FLOPs, and per selective policy the op outputs a selective checkpoint would keep. profile()
runs each stage once on its real input (the previous stage's output) and records exactly that:
bytes from a TorchLedger (saved_tensors_hooks, by storage), FLOPs from
torch.utils.flop_counter.FlopCounterMode plus ckptlab attention's own count, the kept outputs
from the ops the stage dispatches. Gradients are not accumulated into parameters, and torch's
RNG state is restored afterwards. Recompute FLOPs are ckptlab attention's (its S = Q K^T, and
its forward when run again in a backward); an ATen attention's recompute falls into the
backward's count, which FlopCounterMode cannot tell apart.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from ckptlab.recompute.plan import resolve_policy
from ckptlab.recompute.profile import Profile, StageProfile
from ckptlab.torch import selective
from ckptlab.torch.attention import flop_counter
from ckptlab.torch.ledger import TorchLedger, storage_of
from ckptlab.torch.recomputing import recomputing


class _Outputs(TorchDispatchMode):
    """Every ATen op a stage runs, with its output tensors (kept alive, so that no storage
    address is reused while the stage is measured)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        self.calls.append((func.overloadpacket, tensors))
        return out

    def kept(self, ops, led: TorchLedger) -> dict:
        """{label: bytes} of the outputs of `ops`, labelled as the ledger labels its saved
        storages (so a kept output that is also saved is one buffer), else "kept.<k>"."""
        out = {}
        for packet, tensors in self.calls:
            for t in tensors if packet in ops else ():
                key, nbytes = storage_of(t)
                if nbytes:
                    out[led.label_of.get(key, f"kept.{key}")] = nbytes
        return out


class _NotATensor(TypeError):
    """A stage returned something else (its type's name): profile() names the stage."""


def _leaf(x: torch.Tensor) -> torch.Tensor:
    """x as a new activation leaf: same storage, no history, a gradient if x wants one."""
    return x.detach().requires_grad_(x.requires_grad)


def _parameters(stage) -> list:
    return list(stage.parameters()) if isinstance(stage, torch.nn.Module) else []


def _stage(stage, x, policies, recompute) -> tuple:
    """(StageProfile, output) of one stage on input x; the stage runs once more per set of
    ops in `recompute`, under recomputing(ops)."""
    prof, y, trace, counts, led = _run(stage, x, frozenset(), trace=bool(policies))
    for policy in policies:
        ops = selective.aten_ops(policy)
        prof.stored[policy] = {k: b for k, b in trace.kept(ops, led).items() if k != "in"}
        prof.replayed_flops[policy] = sum(n for op, n in counts.items() if op in ops)
    for ops in recompute:
        inner = _run(stage, x, ops)[0]
        prof.recomputed[ops] = (inner.saved, inner.bwd_recompute_flops)
    return prof, y


def _run(stage, x, ops, trace: bool = False) -> tuple:
    """One forward and backward of a stage under recomputing(ops): (StageProfile without
    policies, output, the ops it ran (with trace=True; their outputs are kept alive until the
    stage is measured), FlopCounterMode's forward counts, the ledger)."""
    t, params = _leaf(x), _parameters(stage)
    led = TorchLedger(params, labels=True)
    led.name(t, "in")
    trace = _Outputs() if trace else contextlib.nullcontext()
    with led, FlopCounterMode(display=False) as fc, flop_counter() as att, trace, \
            recomputing(ops):
        y = stage(t)
    if not isinstance(y, torch.Tensor):
        raise _NotATensor(type(y).__name__)
    led.name(y, "out")
    saved = led.held_by_label()
    bwd = rec = 0
    wrt = ([t] if t.requires_grad else []) + [p for p in params if p.requires_grad]
    if y.requires_grad and wrt:
        with FlopCounterMode(display=False) as fb, flop_counter() as ab:
            torch.autograd.grad(y, wrt, torch.ones_like(y), allow_unused=True)
        # a forward of ckptlab attention run again in the backward is recompute
        bwd, rec = fb.get_total_flops() + ab["backward"], ab["recompute"] + ab["forward"]
    prof = StageProfile(storage_of(t)[1], storage_of(y)[1], saved,
                        fc.get_total_flops() + att["forward"], bwd, rec)
    return prof, y, trace, fc.get_flop_counts().get("Global", {}), led


def profile(stages, x, first: int = 0, n_blocks: int | None = None, policies=(),
            recompute=()) -> Profile:
    """Measure each stage once on its real input; blocks first .. first + n_blocks - 1 are
    what a schedule arranges (default: every stage from `first` on). `policies`: selective
    policies (keep(...)) to predict; `recompute`: sets of op names (recompute(attn):
    {"attention"}) to measure the stages under, as ckptlab's own profile does."""
    stages = list(stages)
    policies = [resolve_policy(p) for p in policies]
    recompute = [frozenset(ops) for ops in recompute if ops]
    n_blocks = len(stages) - first if n_blocks is None else n_blocks
    if not (0 <= first and n_blocks >= 1 and first + n_blocks <= len(stages)):
        raise ValueError(f"profile: blocks {first}..{first + n_blocks - 1} do not fit in "
                         f"{len(stages)} stages")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    devices = [x.device.index or 0] if x.device.type == "cuda" else []
    out = []
    with torch.random.fork_rng(devices=devices):
        for i, stage in enumerate(stages):
            try:
                prof, y = _stage(stage, x, policies, recompute)
            except _NotATensor as e:
                raise TypeError(f"profile: stage {i} returned a {e}; a profile measures a chain "
                                "whose stages each take and return one tensor (its input and "
                                "output are one buffer each); a schedule that needs no profile "
                                "(sqrt, every(k), revolve(s)) runs any chain") from None
            out.append(prof)
            x = y
    return Profile(out, first, n_blocks)
