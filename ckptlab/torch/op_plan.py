"""An op-level recompute plan for a chain of torch blocks: what to keep inside each block, by
a dynamic program over its ops chained with one over the blocks, run as PyTorch selective
activation checkpointing (torch.utils.checkpoint.create_selective_checkpoint_contexts).

    prof = profile_blocks(stages(model, y), tokens)  # each stage's ops: bytes, FLOPs
    choice, held, replay = plan(prof, budget)  # per stage: "plain" or ops kept
    plan(profile_blocks(..., time_model=TimeModel.measure()), budget, cost="time")
    loss = run(model, tokens, y, choice)  # the blocks and the head under that plan

A block runs either plainly (it keeps what autograd saves: `plain` bytes, nothing redone) or
checkpointed with a set S of its ops' outputs kept: it holds its input and the outputs in S,
and its backward replays the block's forward but for the ops in S, up to the op that saves the
last tensor the backward needs (non-reentrant checkpoint stops early there). Counted as FLOPs
(matmuls: torch.utils.flop_counter's registry), the replay costs the FLOPs of the ops before
that point, less those of S. Ops without FLOPs (norms, softmax, GeLU, adds) are always
replayed: they cost time and memory traffic, not FLOPs, and keeping them buys no FLOPs. The
embeddings run inside the first block's stage, so that a checkpointed first stage keeps the
token ids, not the embedded sequence.

The DP over ops: every subset of a block's FLOP-bearing ops before that point (2^k of them;
k = 7 in a GPT block: q, k, v, out, fc and attention's two batched matmuls; proj comes after
the last save) gives a point (held bytes, replayed
FLOPs); the block's frontier keeps the Pareto points, plus "plain". The DP over blocks adds
frontiers one block at a time (min-plus: for each total of bytes, the fewest FLOPs), keeping
the Pareto points, so the plan is exact for the objective: fewest replayed FLOPs with the
blocks' bytes at the end of the forward within the budget (torch.compile's
activation_memory_budget budgets its own estimate of those bytes, and by default ranks what to
recompute by FLOPs too). FLOPs make a replayed LayerNorm, softmax or GeLU free; cost="time"
ranks by a TimeModel instead: each op a launch plus the larger of its FLOPs and its bytes at the
CPU's measured rates, every op the replay runs counted, so checkpointing a block costs its
pointwise ops even when every matmul output is kept. Not modeled: what a replay holds in the
backward (one stage's worth at a time), which bench/budget_planner.py measures in its peak
column. Measure that peak without FlopCounterMode active in the backward: it keeps the
replayed tensors alive (on the bench's GPT at torch's 20% budget, 3.8 MB under it against
1.6 MB without).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)
from torch.utils.flop_counter import flop_registry

from ckptlab.torch import ledger as ledgers
from ckptlab.torch.ledger import TorchLedger, storage_of
from ckptlab.torch.recomputing import contexts
from ckptlab.torch.selective import _counting


@dataclass
class BlockOps:
    """One block's ops: per FLOP-bearing call (op name, k-th call of that op) its output's
    bytes and FLOPs; the block's input bytes, plain saved bytes and forward FLOPs."""

    items: list  # [(op name, call index, bytes, flops)]
    in_bytes: int
    plain: int
    flops: int
    frontier: list = field(default_factory=list)  # [(held, replayed flops, choice)]
    item_seconds: list = field(default_factory=list)  # modeled, per item (with a TimeModel)
    seconds: float = 0.0  # modeled seconds of every op the replay runs, FLOPs or not
    frontier_time: list = field(default_factory=list)  # [(held, replayed seconds, choice)]


@dataclass(frozen=True)
class TimeModel:
    """Modeled seconds of one eager op: launch_s + max(FLOPs / flops_per_s, bytes it reads and
    writes / bytes_per_s), the roofline with a per-launch cost (the lab's time model), here
    with the CPU's own three numbers (measure())."""

    launch_s: float
    flops_per_s: float
    bytes_per_s: float

    def seconds(self, flops: int, nbytes: int) -> float:
        return self.launch_s + max(flops / self.flops_per_s, nbytes / self.bytes_per_s)

    @classmethod
    def measure(cls, repeats: int = 21) -> TimeModel:
        """The three numbers on this machine, medians of `repeats` timings: the launch, a
        one-element add; FLOP/s, a 256 x 256 x 256 fp32 matmul (2 n^3 FLOPs); bytes/s, a copy
        of 4 Mi fp32 values (read and written: 32 MiB)."""
        import statistics
        import time

        def median(fn):
            fn()
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
            return statistics.median(times)

        one, a = torch.ones(1), torch.randn(256, 256)
        big, out = torch.randn(4 * 2**20), torch.empty(4 * 2**20)
        launch = median(lambda: torch.add(one, one))
        matmul = median(lambda: a @ a)
        copy = median(lambda: out.copy_(big))
        return cls(launch, 2 * 256**3 / max(matmul - launch, 1e-9),
                   2 * big.numel() * 4 / max(copy - launch, 1e-9))


class _Calls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls, self.count = [], {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func.overloadpacket
        k = self.count.get(packet, 0)
        self.count[packet] = k + 1
        flops = flop_registry[packet](*args, **kwargs, out_val=out) if packet in flop_registry \
            else 0
        nbytes = sum(storage_of(t)[1] for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        moved = sum(t.numel() * t.element_size() for t in tree_leaves((args, kwargs, out))
                    if isinstance(t, torch.Tensor))  # what the op reads and writes
        self.calls.append((str(packet), k, nbytes, int(flops), moved, out))
        return out


def profile_block(block, x, time_model: TimeModel | None = None) -> BlockOps:
    """Run the block once on x: its ops, its plain saved bytes (TorchLedger), its FLOPs; with a
    TimeModel also the modeled seconds of each op the replay runs, FLOPs or not."""
    t = x.detach().requires_grad_(x.requires_grad)
    led = TorchLedger(block.parameters())
    calls, packs = _Calls(), []

    def pack(tensor):  # how many ops had run when autograd saved this tensor
        packs.append(len(calls.calls))
        return led.pack(tensor)

    with torch.random.fork_rng(), led, \
            torch.autograd.graph.saved_tensors_hooks(pack, led.unpack), calls:
        y = block(t)
    # the replay stops once the last saved tensor is saved again (non-reentrant checkpoint's
    # early stop): ops from there on are never replayed, so keeping them buys nothing
    last = max(packs, default=0)
    kept = [c for c in calls.calls[:last] if c[3] > 0]
    items = [(op, k, b, f) for op, k, b, f, _, _ in kept]
    prof = BlockOps(items, storage_of(t)[1], led.bytes, sum(f for *_, f in items))
    prof.frontier = _block_frontier(prof, [f for *_, f in items], prof.flops)
    if time_model is not None:
        prof.item_seconds = [time_model.seconds(f, m) for _, _, _, f, m, _ in kept]
        prof.seconds = sum(time_model.seconds(f, m) for _, _, _, f, m, _ in calls.calls[:last])
        prof.frontier_time = _block_frontier(prof, prof.item_seconds, prof.seconds)
    del y
    return prof


def profile_blocks(blocks, x, time_model: TimeModel | None = None) -> list:
    """profile_block of each block, each on the previous one's output."""
    out = []
    for block in blocks:
        out.append(profile_block(block, x, time_model))
        with torch.no_grad():
            x = block(x)
    return out


def _pareto(points) -> list:
    best = []
    for p in sorted(points, key=lambda q: (q[0], q[1])):
        if not best or p[1] < best[-1][1]:
            best.append(p)
    return best


def _block_frontier(prof: BlockOps, costs: list, total) -> list:
    """The block's Pareto points (held bytes, replay cost, choice): plain (0), or checkpointed
    keeping a subset S of its items, replaying `total` less the `costs` of S."""
    pts = [(prof.plain, 0, "plain")]
    n = len(prof.items)
    if n > 16:
        raise ValueError(f"op_plan: {n} FLOP-bearing ops in a block; the exhaustive DP over "
                         "ops handles at most 16")
    for r in range(n + 1):
        for subset in combinations(range(n), r):
            held = prof.in_bytes + sum(prof.items[i][2] for i in subset)
            replay = total - sum(costs[i] for i in subset)
            pts.append((held, replay, frozenset((prof.items[i][0], prof.items[i][1])
                                                for i in subset)))
    return _pareto(pts)


COSTS = ("flops", "time")


def plan(blocks: list, budget_bytes: int, cost: str = "flops") -> tuple:
    """(per block its choice, held bytes, replay cost): the cheapest replay with the blocks'
    held bytes at most budget_bytes. cost "flops": replayed matmul FLOPs; "time": the modeled
    seconds of every op replayed (blocks profiled with a TimeModel). ValueError when even the
    least does not fit."""
    if cost not in COSTS:
        raise ValueError(f"cost: expected one of {COSTS}, got {cost!r}")
    if cost == "time" and not all(p.frontier_time for p in blocks):
        raise ValueError("op_plan: cost 'time' needs blocks profiled with a TimeModel "
                         "(profile_blocks(..., time_model=TimeModel.measure()))")
    chain = [(0, 0, ())]
    for prof in blocks:
        frontier = prof.frontier if cost == "flops" else prof.frontier_time
        chain = _pareto([(h + bh, c + bc, (*ch, bch)) for h, c, ch in chain
                         for bh, bc, bch in frontier])
    fits = [p for p in chain if p[0] <= budget_bytes]
    if not fits:
        raise ValueError(f"op_plan: budget {budget_bytes} bytes is below the least the blocks "
                         f"can hold, {chain[0][0]} bytes")
    held, replay, choice = fits[-1]
    return list(choice), held, replay


def _policy(keep: frozenset):
    """MUST_SAVE for the k-th call of an op when (op, k) is kept. The forward and a recompute
    count calls apart; PyTorch 2.13 asks the policy in the forward only (its recompute replays
    the cache by op and call index, checkpoint.py's _CachedTorchDispatchMode), older versions
    in both."""
    seen = {False: {}, True: {}}

    def policy_fn(ctx, op, *args, **kwargs):
        packet = str(getattr(op, "overloadpacket", op))
        count = seen[ctx.is_recompute]
        k = count.get(packet, 0)
        count[packet] = k + 1
        return CheckpointPolicy.MUST_SAVE if (packet, k) in keep else \
            CheckpointPolicy.PREFER_RECOMPUTE
    return policy_fn


def context_fn(keep: frozenset, ledger=None):
    """context_fn for checkpoint(): keep the outputs of the calls in `keep` ((op name, k-th
    call) pairs), replay the rest; with a TorchLedger, the kept outputs and the replay's
    saved tensors are counted in it."""
    def make():
        forward, cached = create_selective_checkpoint_contexts(_policy(keep))
        if ledger is not None:
            forward = _counting(forward, ledger)
        return contexts(ledger, frozenset(), forward, cached)()
    return make


def stages(model, targets) -> list:
    """What a plan arranges in a ckptlab.torch.nets Chain: the prefix (the embeddings) with
    block 0, the other blocks, then the head (with the targets: its output is the loss)."""
    from torch import nn

    from ckptlab.torch.nets import _WithTargets
    first = nn.Sequential(*model.prefix(), model.blocks[0])
    return [first, *model.blocks[1:], _WithTargets(model.head, targets)]


def run(model, inputs, targets, choice: list):
    """The loss of a ckptlab.torch.nets Chain on its inputs, its stages run as `choice` says."""
    led = ledgers.current()
    x = inputs
    for stage, c in zip(stages(model, targets), choice, strict=True):
        if c == "plain":
            x = stage(x)
        else:
            x = checkpoint(stage, x, use_reentrant=False, context_fn=context_fn(c, led))
    return x
