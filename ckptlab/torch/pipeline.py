"""Pipeline parallelism on paper, for one stage: which blocks it runs, the order in which it runs
its micro-batches' forwards and backwards under GPipe and 1F1B, how many micro-batches it holds
at once, and the peak of saved bytes that follows, exactly.

    split_layers(8, 4)                    # [range(0, 2), range(2, 4), ...]: blocks per stage
    actions("1f1b", stage=1, stages=4, m=8)   # [("F", 0), ("F", 1), ("F", 2), ("B", 0), ...]
    in_flight("1f1b", 1, 4, 8)            # 3: stage i of p holds p - i micro-batches
    stage_peak(schedule.predict(prof), n_forward(schedule, prof), acts, shared)
    modeled(shape, ...)                   # the same peak in closed form (gpt_bytes)

GPipe (Huang et al. 2019) runs every micro-batch's forward, then every backward: each stage
holds all m. 1F1B (Narayanan et al. 2021, PipeDream-Flush; torch.distributed.pipelining's
Schedule1F1B) lets stage i run p - i forwards, then alternates one backward and one forward:
it never holds more than p - i. A stage's peak is that of its micro-batches side by side: each
runs ckptlab's predicted sequence of steps for one micro-batch (Schedule.predict on the stage's
profile: any schedule inside the stage), in the order the pipeline schedule says; the peak is
the most their bytes add up to at any step. One thing is shared between micro-batches: torch's
schedules split the batch's token ids (first stage) and targets (last stage) into views of the
caller's two tensors, and a saved view holds its whole storage (counted once, by storage, while
any micro-batch holds it: the `shared` buffers).
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptlab.cluster import pipeline as cluster_pipeline
from ckptlab.recompute.plan import Seg
from ckptlab.torch import gpt_bytes

SCHEDULES = ("gpipe", "1f1b")
NAMES = {"gpipe": "GPipe", "1f1b": "1F1B"}  # as the papers and torch's classes spell them


def _positive(name, x) -> None:
    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {x!r}")


def split_layers(layers: int, stages: int) -> list[range]:
    """Contiguous blocks per stage, ckptlab.cluster.pipeline.split_layers' counts (the planner's
    own): evenly when the stages divide the layers, else torchtitan's split, the embedding and
    the head weighing a block each. ValueError unless every stage gets at least one."""
    _positive("layers", layers)
    _positive("stages", stages)
    if layers < stages:
        raise ValueError(f"{layers} layers cannot fill {stages} stages (one block each at least)")
    out, start = [], 0
    for n in cluster_pipeline.split_layers(layers, stages):
        out.append(range(start, start + n))
        start += n
    return out


def actions(kind: str, stage: int, stages: int, m: int) -> list[tuple[str, int]]:
    """The stage's forwards ("F", j) and backwards ("B", j) of micro-batches j = 0..m-1 in the
    order torch.distributed.pipelining runs them (ScheduleGPipe, Schedule1F1B)."""
    _positive("stages", stages)
    _positive("m", m)
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < stages:
        raise ValueError(f"stage: expected an int in [0, {stages}), got {stage!r}")
    if kind == "gpipe":
        return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
    if kind != "1f1b":
        raise ValueError(f"pipeline schedule: expected one of {SCHEDULES}, got {kind!r}")
    warmup = min(m, stages - stage)  # Schedule1F1B: the last stage 1, the first p
    out = [("F", j) for j in range(warmup)]
    f = warmup
    for b in range(m):  # one backward, then one forward while any is left
        out.append(("B", b))
        if f < m:
            out.append(("F", f))
            f += 1
    return out


def in_flight(kind: str, stage: int, stages: int, m: int) -> int:
    """The most micro-batches the stage holds at once (forward done, backward not yet):
    GPipe m, 1F1B min(m, p - i)."""
    held = most = 0
    for act, _ in actions(kind, stage, stages, m):
        held += 1 if act == "F" else -1
        most = max(most, held)
    return most


@dataclass(frozen=True)
class Shared:
    """A buffer each micro-batch saves as a view of one storage: `own` bytes (its slice) in
    ckptlab's prediction for one micro-batch, `whole` bytes (the storage) in fact, saved at the
    prediction's steps `steps` (indices into Prediction.steps)."""

    own: int
    whole: int
    steps: range


def n_forward(schedule, prof) -> int:
    """How many of Prediction.steps are the forward: a plain stage one, a checkpointed
    segment one (its input held) and one per block in it."""
    return sum(1 if not isinstance(item, Seg) else 1 + len(item.blocks())
               for item in schedule.full_plan(prof))


def shared_views(pred, n_fwd: int, first: bool, last: bool, ids: int, whole: int) -> list:
    """The token ids (first stage: the embeddings, the first plain step, save them until the
    last step) and the targets (last stage: the loss, the last forward step, saves them until
    its backward, the next step) as Shared buffers; `ids` bytes a micro-batch, `whole` the
    batch's."""
    out = []
    if first:
        out.append(Shared(ids, whole, range(0, len(pred.steps) - 1)))
    if last:
        out.append(Shared(ids, whole, range(n_fwd - 1, n_fwd)))
    return out


def stage_peak(pred, n_fwd: int, order: list, shared=()) -> int:
    """The peak of saved bytes of a stage that runs `order` (actions()) over micro-batches each
    taking the steps of `pred` (a Prediction for one micro-batch, the first n_fwd of them its
    forward), with the `shared` buffers counted once by storage."""
    steps = [b for _, _, b in pred.steps]
    if max(steps, default=0) != pred.peak_bytes or (steps and steps[-1] != 0):
        raise ValueError("stage_peak: a prediction whose steps end with nothing held and "
                         "reach its peak is expected")
    m = 1 + max(j for _, j in order)
    pos = [-1] * m  # the step each micro-batch has reached (-1: not started)
    peak = 0
    for act, j in order:
        for k in range(n_fwd) if act == "F" else range(n_fwd, len(steps)):
            pos[j] = k
            total = sum(steps[p] for p in pos if p >= 0)
            for s in shared:
                holders = sum(1 for p in pos if p in s.steps)
                total += s.whole * (holders > 0) - s.own * holders
            peak = max(peak, total)
    return peak


def modeled(shape, b: int, blocks: int, first: bool, last: bool, recompute: str, attn: str,
            kind: str, stage: int, stages: int, m: int, device: str = "cpu") -> int | None:
    """The same peak in closed form (gpt_bytes.stage_bytes) for the schedules it models inside
    a stage (recompute "none" or "full": every(1)); micro-batches of b sequences, views of a
    batch of b * m."""
    return gpt_bytes.stage_bytes(shape, b, blocks, first, last, recompute, attn,
                                 in_flight(kind, stage, stages, m), b * m, device)
