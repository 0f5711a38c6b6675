"""ckptlab.cluster.step_memory at t = 2, worked by hand on the small model of
tests/test_step_memory.py (L=4, h=8, a=2, s=4, V=16, micro-batch 1, so s b h = 32): the parts
that only a tensor-parallel layout divides by t, each in a case where it changes the answer:
the embedding dropout's mask with sequence parallelism, the gathered FSDP unit (a layer's
parameters on one tensor-parallel rank), FlashAttention's dQ accumulator and D."""

from ckptlab.cluster import step_memory as sm

SMALL = sm.GPTShape(layers=4, hidden=8, heads=2, seq=4, vocab=16)
SBH = 4 * 1 * 8


def dropout_bytes(layout):
    """What dropout adds to the step's activations under selective recompute (no attention
    core kept, so only the 1-byte masks count)."""
    kw = dict(recipe="bf16", recompute="selective", loss="fused")
    return (sm.step_memory(SMALL, layout, dropout=True, **kw).terms["activations"]
            - sm.step_memory(SMALL, layout, dropout=False, **kw).terms["activations"])


def test_dropout_masks_are_split_by_sequence_parallelism_only():
    """Per layer two 1-byte masks of s b h (after the attention and the MLP), and the embedding
    dropout's one; replicated over t without SP, / t with it (Korthikanti section 4.3):
      t = 2, SP:    4 layers x 2 x 32 / 2 + 32 / 2 = 128 + 16 = 144
      t = 2, no SP: 4 layers x 2 x 32     + 32     = 256 + 32 = 288"""
    assert dropout_bytes(sm.Layout(tp=2, sp=True)) == 4 * 2 * SBH // 2 + SBH // 2 == 144
    assert dropout_bytes(sm.Layout(tp=2, sp=False)) == 4 * 2 * SBH + SBH == 288


def test_fsdp_unit_is_one_layer_on_one_tensor_parallel_rank():
    """ZeRO-3 with t = 2, bf16: the gathered unit and its prefetched neighbour (2 x 2 bytes a
    parameter) and the unit's unsharded 16-bit gradients (2 bytes), 6 bytes a parameter of one
    layer on one rank: (12 h^2 + 7 h) / 2 + 6 h = (768 + 56) / 2 + 48 = 460 parameters,
    6 x 460 = 2760 bytes (the whole layer, 12 h^2 + 13 h = 872, would be 5232)."""
    m = sm.step_memory(SMALL, sm.Layout(dp=2, tp=2, zero=3), "bf16", "selective", loss="fused")
    assert SMALL.layer_params(2) == 460
    assert m.transients["fsdp units"] == 6 * 460 == 2760


def test_flash_backward_accumulator_is_split_by_t():
    """Stage 0 of p = 2 (no head there, so a kept layer's backward is the only candidate beside
    the layers), t = 2 without SP, bf16, no dropout, m = 2: 1F1B keeps p - 0 = 2 micro-batches
    in flight on stage 0, each with its 2 layers and its int64 token and position ids.
      a layer: LN, QKV and MLP inputs (4 s b h, replicated without SP) 2 x 4 x 32 = 256;
               Q, K, V, the projection input, GeLU in and out (12 s b h) / t: 2 x 12 x 32 / 2
               = 384; FlashAttention's L, fp32, a s b / t: 4 x 2 x 4 / 2 = 16; in all 656
      ids:     8 s b + 8 s = 32 + 32 = 64 a micro-batch
      backward of a kept layer: the fp32 dQ accumulator 4 s b h / t = 4 x 32 / 2 = 64 and
               D = rowsum(dO * O), 4 a s b / t = 16: 80 (not split by t it would be 144)
      total:   2 x 64 + 2 x 2 x 656 + 80 = 128 + 2624 + 80 = 2832"""
    assert sm.layer_activations(4, 1, 8, 2, "flash", t=2, dropout=False) == 656
    m = sm.step_memory(SMALL, sm.Layout(tp=2, pp=2), "bf16", "flash", dropout=False,
                       loss="fused", micro_batches=2, stage=0)
    assert m.terms["activations"] == 2 * 64 + 2 * 2 * 656 + 80 == 2832
