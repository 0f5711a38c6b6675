"""ckptlab.cluster.pipeline on paper: the micro-batches a stage holds in flight against a
simulation of Megatron-LM's own schedule (the order its forward_backward_pipelining functions
run forwards and backwards on one stage), Korthikanti's first-stage formula, the bubble, the
layer placement, the bytes between stages, and bad input refused in one line."""

import pytest

from ckptlab.cluster import pipeline


def megatron_peak(stage, p, m, v):
    """Run one stage's op sequence as Megatron-LM orders it (warm-up forwards, then one forward
    and one backward at a time, then the cool-down backwards) and return the per-chunk counts
    of micro-batches in flight at the stage's peak: when the total is largest and, of those
    moments, the first whose chunk with more than layers holds the most (the embeddings' chunk
    0 on stage 0, the head's last chunk on stage p - 1: their bytes grow with that count)."""
    total = m * v
    if v == 1:
        warm = min(p - stage - 1, m)
    elif m == p:
        warm = total
    else:
        warm = min(2 * (p - stage - 1) + (v - 1) * p, total)

    def chunk(k, forward):
        c = (k % (p * v)) // p
        return c if forward else v - 1 - c

    held, best = [0] * v, None
    ops = [("f", k) for k in range(warm)]
    for i in range(total - warm):
        ops += [("f", warm + i), ("b", i)]
    ops += [("b", i) for i in range(total - warm, total)]
    for kind, k in ops:
        held[chunk(k, kind == "f")] += 1 if kind == "f" else -1
        assert min(held) >= 0
        heavy = held[0] if stage == 0 else held[-1] if stage == p - 1 else 0
        if best is None or (sum(held), heavy) > best[0]:
            best = ((sum(held), heavy), list(held))
    assert held == [0] * v  # every micro-batch ran its backward on every chunk
    return best[1]


@pytest.mark.parametrize("p,m,v", [(1, 1, 1), (2, 1, 1), (4, 8, 1), (4, 2, 1), (2, 4, 2),
                                   (4, 8, 2), (4, 4, 3), (8, 16, 3), (3, 9, 2), (5, 10, 4)])
def test_in_flight_is_megatrons_schedule(p, m, v):
    for stage in range(p):
        assert pipeline.in_flight(stage, p, m, v) == megatron_peak(stage, p, m, v), stage


@pytest.mark.parametrize("p", range(2, 9))
def test_in_flight_is_megatrons_schedule_over_a_grid(p):
    for v in range(2, 5):
        for m in range(p, 6 * p + 1, p):
            for stage in range(p):
                assert pipeline.in_flight(stage, p, m, v) == megatron_peak(stage, p, m, v), \
                    (stage, p, m, v)


def test_large_m_is_counted_without_running_the_schedule():
    """m in the millions: the counts repeat every p v steps, so the answer comes at once and is
    a small m's (the peak is reached within the first p v steps of the steady state)."""
    assert pipeline.in_flight(0, 8, 8 * 10**6, 4) == pipeline.in_flight(0, 8, 8 * 6, 4)


def test_by_hand_1f1b_and_interleaved():
    # 1F1B, p = 4: stage i holds p - i micro-batches, never more than m
    assert [pipeline.in_flight(i, 4, 8)[0] for i in range(4)] == [4, 3, 2, 1]
    assert [pipeline.in_flight(i, 4, 2)[0] for i in range(4)] == [2, 2, 2, 1]
    # interleaved p = 2, v = 2, m = 4: stage 0 runs 2 + 2 = 4 warm-up forwards then one more:
    # forwards 0, 1 on chunk 0, 2, 3 on chunk 1, 4 on chunk 0 -> [3, 2]; then backward 0 frees
    # chunk 1 and forward 5 runs on chunk 0 -> [4, 1], as many chunks and more of chunk 0 (the
    # one holding the embeddings' ids and dropout masks): the peak. Stage 1: 2 + 1 -> [2, 1]
    assert pipeline.in_flight(0, 2, 4, 2) == [4, 1]
    assert pipeline.in_flight(1, 2, 4, 2) == [2, 1]


@pytest.mark.parametrize("p,v", [(2, 2), (4, 3), (8, 3), (35, 3)])
def test_first_stage_is_korthikantis_formula(p, v):
    """Korthikanti et al. 2022, section 4.2.3: the first stage of the interleaved schedule holds
    p (1 + (p - 1) / (p v)) stages' worth of activations, p v + p - 1 chunks."""
    chunks = sum(pipeline.in_flight(0, p, 4 * p, v))
    assert chunks == p * v + p - 1
    assert chunks / v == pytest.approx(p * (1 + (p - 1) / (p * v)))


def test_bubble_and_step_units():
    assert pipeline.bubble_fraction(1, 5) == 0
    assert pipeline.bubble_fraction(4, 8) == 3 / 8
    assert pipeline.bubble_fraction(4, 8, 2) == 3 / 16
    assert pipeline.step_units(4, 8, 2) == 8 + 3 / 2


def test_layer_placement_and_p2p():
    assert pipeline.layers_per_chunk(96, 8, 3) == 4
    # Megatron's placement: chunk c of stage i holds layers (c p + i) n ...
    assert list(pipeline.chunk_layers(1, 0, 8, 2, 2)) == [2, 3]
    assert list(pipeline.chunk_layers(1, 1, 8, 2, 2)) == [6, 7]
    every = sorted(x for i in range(2) for c in range(2)
                   for x in pipeline.chunk_layers(i, c, 8, 2, 2))
    assert every == list(range(8))
    assert pipeline.p2p_bytes(2048, 1, 12288, 8, scatter=False) == 2048 * 12288 * 2
    assert pipeline.p2p_bytes(2048, 1, 12288, 8) == 2048 * 12288 * 2 // 8


@pytest.mark.parametrize("call,message", [
    (lambda: pipeline.layers_per_chunk(96, 7), "p = 7 must divide the 96 layers"),
    (lambda: pipeline.layers_per_chunk(96, 8, 5), "p x v = 8 x 5"),
    (lambda: pipeline.layers_per_chunk(96, 1, 2), "need a pipeline"),
    (lambda: pipeline.in_flight(0, 4, 6, 2), "multiple of p = 4"),
    (lambda: pipeline.in_flight(4, 4, 8), "stage: expected"),
    (lambda: pipeline.bubble_fraction(0, 4), "p: expected a positive int"),
    (lambda: pipeline.bubble_fraction(2, True), "micro-batches m: expected"),
    (lambda: pipeline.layers_per_chunk(2.5, 1), "layers: expected"),
])
def test_bad_input_is_one_line(call, message):
    with pytest.raises(ValueError, match=message):
        call()
