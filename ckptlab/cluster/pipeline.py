"""Pipeline parallelism on paper: which layers a stage holds, how many micro-batches' activations
it keeps in flight, the bubble, and the bytes sent between stages. Every number is *modeled*.

The L layers are split over p stages (GPUs along the pipeline), each stage into v chunks of
L / (p v) layers (v = 1: one chunk a stage). Megatron-LM's placement (Narayanan et al. 2021,
"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC'21,
section 2.2): chunk c of stage i holds layers [(c p + i) n, (c p + i + 1) n), n = L / (p v); the
token and position embeddings sit on stage 0, the final LayerNorm and the head (logits, loss)
on stage p - 1. Megatron refuses a split that does not divide (its assertion "num_layers should
be divisible by pipeline-model-parallel-size", and by p v with virtual stages); so does
layers_per_chunk, with the reason.

Uneven stages (split_layers, v = 1): when p does not divide L, torchtitan's split
(torchtitan/distributed/pipeline_parallel.py, generate_llm_fqn_per_model_part, input_weight =
output_weight = 1): the embedding and the head each weigh one layer, the L + 2 units are
spread as evenly as can be (the first (L + 2) mod p stages one more), and the first and last
stages hold one layer fewer than their units. 126 layers over 16 stages: 7, 8 x 14, 7, Meta's
Llama 3 405B split ("we reduce one Transformer layer each from the first and the last stages",
Llama 3 paper, section 3.3.2); 70 over 12: 5, 6 x 10, 5. Megatron-LM's
--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers (first, last): the
first and last stages hold what is asked, the stages between an equal share of the rest.
One function for both halves of ckptlab: the planner's stages and the torch pipeline's
(ckptlab.torch.pipeline.split_layers) come from split_layers here.

Schedules (m micro-batches a step, a micro-batch's forward + backward on one chunk t_f + t_b):
  1f1b          PipeDream-Flush (Narayanan et al. 2021, section 2.2.1): stage i runs
                p - i - 1 warm-up forwards, then alternates one forward and one backward, so it
                holds at most min(p - i, m) micro-batches' activations: the first stage the most.
                Step = (m + p - 1)(t_f + t_b); the bubble over the ideal time (p - 1) / m,
                the idle share of the step (p - 1) / (m + p - 1) (27% at p = 4, m = 8).
  interleaved   the interleaved 1F1B (section 2.2.2): v chunks a stage, bubble (p - 1) / (v m),
                v times the point-to-point traffic. Megatron-LM's schedule
                (megatron/core/pipeline_parallel/schedules.py,
                forward_backward_pipelining_with_interleaving): stage i runs
                2 (p - i - 1) + (v - 1) p warm-up forwards (all m v of them when m = p), the k-th
                forward on chunk (k mod p v) // p, and needs m to be a multiple of p. The first
                stage holds p + (p - 1) / v micro-batches' worth of one stage's activations
                (Korthikanti et al. 2022, section 4.2.3: "p (1 + (p - 1) / (p m))" with their
                m = v), more than 1F1B's p.

Point-to-point: each micro-batch crosses every stage boundary once forward (the activation,
s b h values) and once backward (its gradient); v times with virtual stages. With Narayanan's
scatter/gather optimisation (section 4.1, on in Megatron-LM by default when t > 1) or sequence
parallelism each of the t tensor-parallel ranks sends its 1/t share over InfiniBand and the
receiving stage all-gathers it over NVLink.
"""

from __future__ import annotations

SCHEDULES = ("1f1b", "interleaved")


def _count(name: str, x) -> None:
    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
        raise ValueError(f"{name}: expected a positive int, got {x!r}")


def layers_per_chunk(layers: int, p: int, v: int = 1) -> int:
    """L / (p v), the layers of one chunk; ValueError when p v does not divide L."""
    for name, x in (("layers", layers), ("p", p), ("v", v)):
        _count(name, x)
    if v > 1 and p < 2:
        raise ValueError(f"v = {v} virtual stages need a pipeline (p >= 2), got p = {p}")
    if layers % (p * v):
        what = f"p = {p}" if v == 1 else f"p x v = {p} x {v} = {p * v}"
        raise ValueError(f"{what} must divide the {layers} layers (Megatron-LM splits them "
                         "evenly; choose a p that divides L)")
    return layers // (p * v)


def split_layers(layers: int, p: int, first: int | None = None,
                 last: int | None = None) -> list[int]:
    """Layers per stage (module docstring): evenly when p divides L and no first / last is
    given, else torchtitan's split with the embedding and head weighing a layer each, or
    Megatron's first / last stage sizes. ValueError unless every stage gets a layer."""
    _count("layers", layers)
    _count("p", p)
    if first is not None or last is not None:
        return _megatron_split(layers, p, first, last)
    if layers % p == 0:
        return [layers // p] * p
    units, extra = divmod(layers + 2, p)
    counts = [units + (i < extra) for i in range(p)]
    counts[0] -= 1
    counts[-1] -= 1
    if p > layers or min(counts) < 1:
        raise ValueError(f"{layers} layers cannot fill {p} stages (one block each at least, "
                         "the embedding and the head weighing a layer each)")
    return counts


def _megatron_split(layers: int, p: int, first, last) -> list[int]:
    """Megatron-LM's --decoder-first/last-pipeline-num-layers: the middle stages share the
    rest evenly (its assertion: they must)."""
    for name, x in (("first", first), ("last", last)):
        if x is not None:
            _count(f"{name} stage's layers", x)
    if p < 2:
        raise ValueError("first / last stage sizes need a pipeline (p >= 2)")
    ends = [x for x in (first, last) if x is not None]
    middle = p - len(ends)
    rest = layers - sum(ends)
    if middle == 0:
        if rest:
            raise ValueError(f"first + last = {sum(ends)} must be the {layers} layers at p = 2")
        return [first, last]
    if rest < middle or rest % middle:
        raise ValueError(f"the {rest} layers left after the first / last stages must split "
                         f"evenly over the other {middle} stages (Megatron-LM's requirement)")
    per = rest // middle
    return [first if first is not None else per] + [per] * (p - 2) + \
        [last if last is not None else per]


def stage_chunk_layers(layers: int, p: int, v: int, stage: int) -> int:
    """Layers of one chunk of stage `stage`: L / (p v) with virtual stages (they must divide),
    split_layers' share of the stage with one chunk."""
    if v > 1:
        return layers_per_chunk(layers, p, v)
    return split_layers(layers, p)[stage]


def distinct_stages(layers: int, p: int, v: int = 1) -> list[int]:
    """The stages whose memory or time can be the most: the first and last (embeddings, head)
    and, of the stages between, the first with each layer count above the first stage's (one
    with no more layers than the first holds fewer micro-batches and no embedding, and runs no
    longer; of two with one count the earlier holds more)."""
    counts = [layers // (p * v)] * p if v > 1 else split_layers(layers, p)
    out, seen = {0, p - 1}, set()
    for i in range(1, p - 1):
        if counts[i] > counts[0] and counts[i] not in seen:
            seen.add(counts[i])
            out.add(i)
    return sorted(out)


def chunk_layers(stage: int, chunk: int, layers: int, p: int, v: int = 1) -> range:
    """The layers chunk `chunk` of stage `stage` holds (Megatron's placement)."""
    n = layers_per_chunk(layers, p, v)
    if not (0 <= stage < p and 0 <= chunk < v):
        raise ValueError(f"stage, chunk: expected 0 <= stage < {p} and 0 <= chunk < {v}, got "
                         f"{stage}, {chunk}")
    first = (chunk * p + stage) * n
    return range(first, first + n)


def check_micro_batches(m: int, p: int, v: int = 1) -> None:
    """Megatron's interleaved schedule needs m a multiple of p."""
    _count("micro-batches m", m)
    if v > 1 and m % p:
        raise ValueError(f"the interleaved schedule needs the micro-batches m = {m} to be a "
                         f"multiple of p = {p} (Megatron-LM's requirement)")


def in_flight(stage: int, p: int, m: int, v: int = 1) -> list[int]:
    """Per chunk of `stage`, the micro-batches whose activations it holds at its peak:
    min(p - i, m) with 1F1B. With v chunks, Megatron's order (module docstring): w warm-up
    forwards, w = min(2 (p - i - 1) + (v - 1) p, m v) (m v when m = p), then forward w + j and
    backward j alternate, the j-th backward on chunk v - 1 - (j mod p v) // p. The stage holds
    w + 1 micro-batch chunks after every forward of that steady state; of those moments the
    peak is the one whose chunk with more than layers (the embeddings' on stage 0, the head's
    on stage p - 1) holds the most: on stage 0 chunk 0 keeps filling while the backwards free
    the later chunks first, so its count can exceed what it holds at the first backward."""
    _count("p", p)
    _count("v", v)
    if not 0 <= stage < p:
        raise ValueError(f"stage: expected 0 <= stage < {p}, got {stage!r}")
    check_micro_batches(m, p, v)
    if v == 1:
        return [min(p - stage, m)]
    total = m * v
    warm = total if m == p else min(2 * (p - stage - 1) + (v - 1) * p, total)
    if warm == total:  # every forward runs before the first backward
        return [m] * v
    # only the counts per chunk matter, and they repeat every p v steps: whole groups of p v
    # forwards or backwards are counted at once (m v can be large)
    moments = [[_ran(warm + j + 1, c, p, v) - _ran(j, v - 1 - c, p, v) for c in range(v)]
               for j in range(min(total - warm, p * v))]
    heavy = 0 if stage == 0 else v - 1 if stage == p - 1 else None
    if heavy is None:
        return moments[0]
    return max(moments, key=lambda counts: counts[heavy])  # the first of the fullest


def _ran(n: int, c: int, p: int, v: int) -> int:
    """Of the first n forwards (or backwards, with c counted from the last chunk), how many ran
    on chunk c: the k-th on chunk (k mod p v) // p."""
    whole, rest = divmod(n, p * v)
    return whole * p + min(max(rest - c * p, 0), p)


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """(p - 1) / (v m): the pipeline's idle time over its ideal time (Narayanan et al. 2021,
    sections 2.2.1-2.2.2)."""
    _count("p", p)
    _count("v", v)
    check_micro_batches(m, p, v)
    return (p - 1) / (v * m)


def step_units(p: int, m: int, v: int = 1) -> float:
    """A step's time in units of one micro-batch's forward + backward on a whole stage:
    m + (p - 1) / v (the ideal m, plus the bubble)."""
    return m * (1 + bubble_fraction(p, m, v))


def p2p_bytes(s: int, b: int, h: int, t: int = 1, scatter: bool = True,
              bytes_per_value: int = 2) -> int:
    """Bytes one GPU sends across one stage boundary per micro-batch and direction: the s b h
    activation (or its gradient); 1/t of it when each tensor-parallel rank sends its share
    (`scatter`: sequence parallelism, or Narayanan's scatter/gather, on in Megatron-LM by
    default), the receiver all-gathering the rest over NVLink."""
    for name, x in (("s", s), ("b", b), ("h", h), ("t", t), ("bytes_per_value", bytes_per_value)):
        _count(name, x)
    return s * b * h * bytes_per_value // (t if scatter else 1)
