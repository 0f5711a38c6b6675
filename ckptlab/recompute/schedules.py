"""Recompute schedules for a chain of blocks, each inspectable before it runs.

A Schedule is a named plan (ckptlab.recompute.plan: block indices and checkpointed Segs).
Given a profile.Profile (each stage's saved bytes and FLOPs, measured once), `predict()` walks the
plan the way the engine will and returns the step sequence, the saved bytes after every step, the
peak, and the recompute FLOPs. Tests hold the engine's measured ledger to these predictions.

    none                 store everything: peak ~ L blocks
    every(k), sqrt       uniform checkpointed segments; sqrt: round(sqrt L) of them, peak
                         ~ 2 sqrt(L) blocks for one extra forward (Chen et al. 2016)
    chen_greedy(b)       Chen's Algorithm 3: close a segment with the block whose saved
                         bytes take its running total over b
    revolve(s)           binomial checkpointing (Griewank & Walther) with s snapshots: the
                         fewest recomputed blocks for a uniform chain, multi-level
    optimal(bytes)       dynamic programming over the measured, heterogeneous chain: the least
                         recompute FLOPs whose predicted peak fits the budget
    keep(policy)         each block checkpointed, but the outputs of the ops the policy names
                         kept: keep(matmul) recomputes everything else in the block (layernorm,
                         GELU, dropout, the attention core); "selective(policy)" is an alias
    recompute(attn)      Korthikanti et al.'s selective recompute: no block checkpointed, only
                         the attention core (Q K^T, softmax, dropout; its input q, k, v kept)
                         redone in the backward; every other activation kept
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from ckptlab.recompute.optimal import optimal_plan, revolve_cost, revolve_plan
from ckptlab.recompute.plan import POLICIES, Seg, check_plan, plan_blocks, uniform_plan
from ckptlab.recompute.profile import Profile, StageProfile


@dataclass
class Schedule:
    """A named plan over blocks 0..L-1; predict(profile) says what it will hold and redo."""

    name: str
    plan: list  # over blocks 0..L-1
    recompute_ops: frozenset = frozenset()  # ops that recompute their insides (tape.recomputing)

    def full_plan(self, prof) -> list:
        """The plan over all stages of `prof`: the stages around the blocks run plainly."""
        shift = prof.first
        check_plan(self.plan, prof.n_blocks)
        inner = [_shift(item, shift) for item in self.plan]
        return list(range(shift)) + inner + list(range(shift + prof.n_blocks, len(prof.stages)))

    def predict(self, prof) -> Prediction:
        return simulate(self.full_plan(prof), prof, self.recompute_ops)

    def describe(self) -> str:
        """The step sequence, readable without a profile (see Prediction.describe)."""
        L = len(plan_blocks(self.plan))
        unit = [StageProfile(1, 1, {"in": 1}, 1, 2, 0) for _ in range(L)]
        return simulate(self.plan, Profile(unit, 0, L)).describe()

    def __repr__(self):
        return f"Schedule({self.name}: {self.plan})"


def _shift(item, k):
    if isinstance(item, Seg):
        return Seg([_shift(i, k) for i in item.items], item.policy)
    return item + k


# ------------------------------------------------------------------------------ builders


def none(L: int) -> Schedule:
    return Schedule("none", list(range(_count(L))))


def uniform(L: int, segments: int) -> Schedule:
    """`segments` checkpointed segments of near-equal length (sizes differ by at most one)."""
    return Schedule(f"uniform({segments})", uniform_plan(_count(L), segments))


def every(k: int, L: int) -> Schedule:
    """A checkpointed segment every k blocks (the last one may be shorter)."""
    L = _count(L)
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"every: k must be an int >= 1, got {k!r}")
    return Schedule(f"every({k})", [Seg(range(a, min(a + k, L))) for a in range(0, L, k)])


def sqrt(L: int) -> Schedule:
    """round(sqrt(L)) uniform segments, every one checkpointed: one extra forward in all."""
    s = uniform(L, max(1, round(math.sqrt(_count(L)))))
    s.name = "sqrt"
    return s


def selective(policy, L: int) -> Schedule:
    """Each block its own checkpointed segment that keeps the outputs of the policy's ops:
    keep(matmul) recomputes everything else (layernorm, GELU, dropout, the attention core). Not
    Korthikanti's selective recompute (that is recompute_attention). In a ReLU MLP it holds
    more than none: the first matmul's output replaces ReLU's (same size) and the second
    matmul's output, which no backward of a plain block keeps, comes on top."""
    name = policy if isinstance(policy, str) else "+".join(sorted(policy))
    return Schedule(f"keep({name})", [Seg([i], policy) for i in range(_count(L))])


def recompute_attention(L: int) -> Schedule:
    """Korthikanti et al. 2022's selective recompute: every block runs plainly, except that its
    attention core keeps only q, k, v and redoes S = Q K^T and P = softmax(S) (and the dropout
    mask) in its backward; every other activation is kept."""
    return Schedule("recompute(attn)", list(range(_count(L))), frozenset({"attention"}))


def chen_greedy(budget_bytes, prof) -> Schedule:
    """Chen et al. 2016, Algorithm 3 (memory planning with budget b), as published: walk the
    blocks adding each one's saved bytes to a running total; when the total exceeds b, the
    block just added closes its segment (a checkpoint after it) and the total restarts at 0.
    So every closed segment is the shortest run whose bytes exceed b, and the blocks after the
    last cut form a last segment of at most b. b is Chen's approximate per-segment budget, not
    the peak; every segment is checkpointed."""
    budget_bytes = _budget(budget_bytes, "chen_greedy")
    sizes = [sum(p.saved.values()) for p in _blocks(prof)]
    segs, start, total = [], 0, 0
    for i, size in enumerate(sizes):
        total += size
        if total > budget_bytes:
            segs.append(Seg(range(start, i + 1)))
            start, total = i + 1, 0
    if start < len(sizes):
        segs.append(Seg(range(start, len(sizes))))
    return Schedule(f"chen_greedy({int(budget_bytes)})", segs)


def revolve(snapshots: int, L: int) -> Schedule:
    """Binomial checkpointing: at most `snapshots` block inputs held by checkpoints at once
    (the chain's own input included) and one block's activations; recomputes revolve_cost(L, s)
    blocks, the fewest possible (Griewank & Walther 2000)."""
    L = _count(L)
    if not isinstance(snapshots, int) or snapshots < 1:
        raise ValueError(f"revolve: snapshots {snapshots!r} is below the minimum feasible 1 "
                         "(the chain's input must be kept)")
    return Schedule(f"revolve({snapshots})", revolve_plan(L, snapshots))


def optimal(budget_bytes, prof) -> Schedule:
    """The plan with the fewest recompute FLOPs whose predicted peak saved bytes (the whole
    step, stages around the blocks included) is at most `budget_bytes`. Raises ValueError
    naming the minimum feasible peak when the budget is below it."""
    budget_bytes = _budget(budget_bytes, "optimal")
    full = optimal_plan(prof, budget_bytes)
    first, n = prof.first, prof.n_blocks
    plan = [_shift(item, -first) for item in full  # drop the plain stages around the blocks
            if isinstance(item, Seg) or first <= item < first + n]
    return Schedule(f"optimal({int(budget_bytes)})", plan)


def _budget(budget_bytes, who: str):
    """A budget in bytes: a finite real number >= 0 (NaN compares false with every peak, and
    a budget that is infinite, or infinite once rounded, names no schedule)."""
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, float, np.number)):
        raise ValueError(f"{who}: budget must be a number of bytes, got {budget_bytes!r}")
    if not math.isfinite(budget_bytes) or budget_bytes < 0:
        raise ValueError(f"{who}: budget must be a finite number of bytes >= 0, got "
                         f"{budget_bytes!r}")
    return budget_bytes


def _blocks(prof):
    return prof.stages[prof.first:prof.first + prof.n_blocks]


def _count(L) -> int:
    if isinstance(L, bool) or not isinstance(L, int) or L < 1:
        raise ValueError(f"L: expected a number of blocks >= 1, got {L!r}")
    return L


_SPEC = re.compile(r"^\s*([a-z_]+)\s*(?:\(\s*([^)]*?)\s*\))?\s*$")


def make(spec: str, L: int | None = None, prof=None) -> Schedule:
    """A schedule from its name: none, sqrt, every(k), uniform(s), revolve(s), keep(policy)
    (alias selective(policy)), recompute(attn), chen_greedy(bytes), optimal(bytes). A budget
    may be given as a percentage ("optimal(50%)") of the peak with no checkpointing, which
    needs the profile."""
    m = _SPEC.match(spec) if isinstance(spec, str) else None
    if m is None:
        raise ValueError(f"schedule: cannot parse {spec!r}; expected e.g. 'sqrt', 'every(4)', "
                         "'revolve(3)', 'optimal(2e6)', 'optimal(50%)', 'keep(matmul)', "
                         "'recompute(attn)'")
    name, arg = m.group(1), m.group(2)
    L = prof.n_blocks if L is None and prof is not None else L
    if L is None:
        raise ValueError(f"schedule {spec!r}: give L (the number of blocks) or a profile")
    if name in ("none", "sqrt") and not arg:
        return none(L) if name == "none" else sqrt(L)
    if name in ("every", "uniform", "revolve") and arg and arg.isdigit():
        k = int(arg)
        if name == "every":
            return every(k, L)
        return uniform(L, k) if name == "uniform" else revolve(k, L)
    if name in ("selective", "keep") and arg:
        return selective(arg, L)
    if name == "recompute" and arg in ("attn", "attention"):
        return recompute_attention(L)
    if name in ("chen_greedy", "optimal") and arg:
        if prof is None:
            raise ValueError(f"schedule {spec!r} needs a profile (profile.profile) of the chain")
        try:
            if arg.endswith("%"):  # of the peak with no checkpointing
                budget = float(arg[:-1]) / 100 * none(L).predict(prof).peak_bytes
            else:
                budget = float(arg)
        except ValueError:
            raise ValueError(f"schedule {spec!r}: expected a budget in bytes or a percentage, "
                             f"got {arg!r}") from None
        sched = chen_greedy(budget, prof) if name == "chen_greedy" else optimal(budget, prof)
        if arg.endswith("%"):  # keep the name the user chose: "optimal(40%)", not its bytes
            sched = Schedule(f"{name}({arg})", sched.plan)
        return sched
    raise ValueError(f"schedule: unknown or incomplete spec {spec!r}")


# ------------------------------------------------------------------------------ prediction


@dataclass
class Prediction:
    """What a plan will do: steps (action, stage, saved bytes after), the peak, FLOPs."""

    steps: list = field(default_factory=list)
    peak_bytes: int = 0
    peak_snapshots: int = 0  # block inputs held by checkpoints at once
    peak_tapes: int = 0  # blocks holding their saved activations at once
    model_flops: int = 0
    recompute_flops: int = 0

    @property
    def hardware_flops(self) -> int:
        return self.model_flops + self.recompute_flops

    def timeline(self):
        """(bytes after each step, phase spans) in plots.plot_memory_trace's form."""
        phase = {"F": "forward", "f": "forward", "R": "recompute", "r": "recompute",
                 "B": "backward", "free": "backward"}
        values, spans, last = [], [], None
        for k, (action, _, b) in enumerate(self.steps):
            kind = phase.get(action, last or "forward")
            values.append(b)
            if spans and spans[-1][2] == kind:
                spans[-1] = (spans[-1][0], k + 1, kind)
            else:
                spans.append((k, k + 1, kind))
            last = kind
        return values, spans

    def plot(self, name: str = "predicted", measured=None, path=None):
        """Saved bytes over the steps (plots.plot_memory_trace); `measured`, a Ledger of the
        same run, adds its op-by-op trace as a second line."""
        from ckptlab.measure import plots

        values, spans = self.timeline()
        traces = {name: values}
        if measured is not None:
            traces["measured (per op)"] = measured.timeline()[0]
        return plots.plot_memory_trace(traces, spans, path=path)

    def describe(self) -> str:
        """Compact: F3 forward with grad, f3 without, R3/r3 the same in a recompute, B3
        backward, +x3/-x3 a checkpoint takes/drops block 3's input."""
        words = {"hold": "+x", "free": "-x"}
        return " ".join(f"{words.get(a, a)}{i}" for a, i, _ in self.steps)


def _check_policies(items, stages) -> None:
    """A selective Seg needs what its policy stores per block, measured by the profile."""
    for item in items:
        if not isinstance(item, Seg):
            continue
        missing = [j for j in item.blocks() if item.policy and item.policy not in stages[j].stored]
        if missing:
            name = next((k for k, v in POLICIES.items() if v == item.policy), sorted(item.policy))
            raise ValueError(f"keep({name if isinstance(name, str) else '+'.join(name)}): "
                             f"the profile has no measurement for this policy (stage "
                             f"{missing[0]}); build it with profile(..., policies=[{name!r}])")
        _check_policies(item.items, stages)


def simulate(plan, prof, recompute_ops=frozenset()) -> Prediction:
    """Walk `plan` (over all stages of `prof`) exactly as checkpoint/autograd execute it,
    counting buffers by name: ("x", i) is stage i's input (= stage i-1's output), ("b", i, l)
    a buffer made inside stage i. A buffer held by several holders counts once. With
    `recompute_ops`, a stage saves and recomputes as profiled under tape.recomputing."""
    pred, held = Prediction(), {}
    ops = frozenset(recompute_ops)
    if ops and any(isinstance(i, Seg) and i.policy for i in plan):
        raise ValueError("simulate: a keep(...) segment under recompute_ops is not profiled")
    if ops and any(ops not in s.recomputed for s in prof.stages):
        raise ValueError(f"simulate: the profile has no run with {sorted(ops)} recomputing; "
                         f"profile with recompute=[{set(ops)}]")
    stages = prof.stages
    _check_policies(plan, stages)
    state = {"bytes": 0, "tapes": 0}
    snaps = {}  # block inputs held by checkpoints -> how many checkpoints hold each

    def name(i, label):
        return ("x", i) if label == "in" else ("x", i + 1) if label == "out" else ("b", i, label)

    def acquire(names):
        for key, nbytes in names:
            if key not in held:
                held[key] = [nbytes, 0]
                state["bytes"] += nbytes
            held[key][1] += 1
        pred.peak_bytes = max(pred.peak_bytes, state["bytes"])
        return names

    def release(names):
        for key, _ in names:
            held[key][1] -= 1
            if held[key][1] == 0:
                state["bytes"] -= held.pop(key)[0]

    def step(action, i):
        pred.steps.append((action, i, state["bytes"]))

    def level(items, recompute):
        pending = []
        for item in items:
            if isinstance(item, Seg):
                blocks = item.blocks()
                c = blocks[0]
                names = [(("x", c), stages[c].in_bytes)]
                for j in blocks if item.policy else ():
                    names += [(name(j, k), b) for k, b in stages[j].stored[item.policy].items()]
                pending.append((item, acquire(names)))
                snaps[c] = snaps.get(c, 0) + 1
                pred.peak_snapshots = max(pred.peak_snapshots, len(snaps))
                step("hold", c)
                for j in blocks:
                    step("r" if recompute else "f", j)
                    pred.recompute_flops += stages[j].fwd_flops if recompute else 0
            else:
                saved = stages[item].saved_under(ops)
                pending.append((item, acquire([(name(item, k), b) for k, b in saved.items()])))
                state["tapes"] += 1
                pred.peak_tapes = max(pred.peak_tapes, state["tapes"])
                step("R" if recompute else "F", item)
                pred.recompute_flops += stages[item].fwd_flops if recompute else 0
        for item, names in reversed(pending):
            if isinstance(item, Seg):
                level(item.items, recompute=True)
                for j in item.blocks() if item.policy else ():
                    pred.recompute_flops -= stages[j].replayed_flops[item.policy]
                release(names)
                c = item.blocks()[0]
                snaps[c] -= 1
                if snaps[c] == 0:
                    del snaps[c]
                step("free", c)
            else:
                release(names)
                state["tapes"] -= 1
                pred.recompute_flops += stages[item].bwd_recompute_under(ops)
                step("B", item)

    level(plan, recompute=False)
    pred.model_flops = sum(s.fwd_flops + s.bwd_flops for s in stages)
    return pred


__all__ = ["Schedule", "Prediction", "none", "uniform", "every", "sqrt", "selective",
           "recompute_attention",
           "chen_greedy", "revolve", "optimal", "make", "simulate", "revolve_cost"]
