"""ckptlab.cluster.step_time on paper: a step's seconds worked by hand, term by term, for every
parameter that changes them (tensor and sequence parallelism, pipeline stages and virtual
stages, each ZeRO stage's traffic per micro-batch, recompute, overlap), standard attention's
launches (scores, probabilities and dropout through HBM) worked by hand, FlashAttention from
the lab's time model (so it wins below d = 2R/3), and bad input refused."""

import pytest

from ckptlab.cluster import step_memory as sm
from ckptlab.cluster import step_time
from ckptlab.measure import crossing, roofline, timemodel

A100 = "A100-SXM4-80GB"
F = 0.5
PEAK = F * 312e12
HBM = 2039e9
NVLINK, IB = 230e9, 24e9  # achieved: ckptlab.cluster.links (NCCL busbw measured)
G = sm.GPTShape(layers=4, hidden=256, heads=4, seq=128, vocab=1024)


def unfused(b, heads, s, d, dropout=True):
    """Standard attention's (forward, backward) seconds by hand: n scores, x elements of each
    of Q, K, V, O at 2 bytes; 3 us a launch plus max(FLOPs / peak, bytes / HBM)."""
    n, x, g = b * heads * s * s, b * heads * s * d, 2 * b * heads * s * s * d

    def run(flops, nbytes):
        return 3e-6 + max(flops / PEAK, nbytes / HBM)

    drop = run(0, 5 * n) if dropout else 0.0  # read 2, write 2 and the 1-byte mask
    fwd = run(g, 4 * x + 2 * n) + run(0, 4 * n) + drop + run(g, 2 * n + 4 * x)
    bwd = run(g, 4 * x + 2 * n) + run(g, 2 * n + 4 * x) + drop + run(0, 6 * n) \
        + 2 * run(g, 2 * n + 4 * x)
    return fwd, bwd


def attention(method, b, heads, s, d, causal):
    mt = timemodel.method_time(method, b, heads, s, s, d, A100, causal=causal, dtype="bf16",
                               achievable=F)
    fwd = sum(x.seconds for x in mt.launches["unique"] if "bwd" not in x.kernel)
    return fwd, mt.lower - fwd


def test_one_gpu_by_hand():
    """t = p = d = 1, m = 3 micro-batches of 2, no recompute: matmuls at F x peak, the
    standard attention's launches (every score), element-wise bytes at the HBM bandwidth, the
    head, Adam's update."""
    s, b, h, a, V, L = 128, 2, 256, 4, 1024, 4
    st = step_time.step_time(G, sm.Layout(micro_batch=b), A100, "bf16", "none",
                             micro_batches=3, achievable=F)
    lin = 24 * b * s * h * h / PEAK
    head = 2 * b * s * h * V / PEAK
    af, ab = unfused(b, a, s, h // a)
    ew = (4 * 2 + 2 * (3 * 2 + 1) + 14 * 2) * s * b * h / HBM  # 50 bytes a value of s b h
    t = st.terms
    assert t["matmul_f"] == pytest.approx(3 * (L * lin + head))
    assert t["matmul_b"] == pytest.approx(3 * (2 * L * lin + 2 * head))
    assert (t["attention_f"], t["attention_b"]) == pytest.approx((3 * L * af, 3 * L * ab))
    assert t["elementwise_f"] == pytest.approx(3 * L * ew)
    assert t["elementwise_b"] == pytest.approx(3 * L * 2 * ew)
    assert t["tp_f"] == t["tp_b"] == t["p2p"] == t["bubble"] == t["dp_exposed"] == 0
    assert t["optimizer"] == pytest.approx(G.params() * (24 + 2 + 2) / HBM)
    assert st.step_s == pytest.approx(sum(t.values()))


def test_recompute_by_hand():
    """Selective recompute reruns the attention's forward launches; a layer recomputed whole
    reruns its matmuls, attention and element-wise forward; flash recomputes inside its own
    backward (nothing extra)."""
    b, s, h, a = 1, 128, 256, 4
    kw = dict(micro_batches=1, achievable=F)
    none = step_time.step_time(G, sm.Layout(), A100, "bf16", "none", **kw)
    sel = step_time.step_time(G, sm.Layout(), A100, "bf16", "selective", **kw)
    af, _ = unfused(b, a, s, h // a)
    assert sel.terms["recompute"] == pytest.approx(4 * af)
    assert none.terms["recompute"] == 0
    full1 = step_time.step_time(G, sm.Layout(), A100, "bf16", "none", full_layers=1, **kw)
    ew = 50 * s * b * h / HBM
    assert full1.terms["recompute"] == pytest.approx(24 * b * s * h * h / PEAK + af + ew)
    # with t = 2 the recomputed forward repeats its two collectives too
    tp1 = step_time.step_time(G, sm.Layout(tp=2), A100, "bf16", "none", full_layers=1, **kw)
    af2, _ = unfused(b, a // 2, s, h // a)
    ew2 = ((4 * 2 + 2 * 7) * s * b * h + 28 * s * b * h // 2) / HBM
    coll = 2 * (1 / 2) * s * b * h * 2 / NVLINK
    assert tp1.terms["recompute"] == pytest.approx(
        24 * b * s * h * h / 2 / PEAK + af2 + ew2 + 2 * coll)
    flash = step_time.step_time(G, sm.Layout(), A100, "bf16", "flash", **kw)
    ff, fb = attention("flash", b, a, s, h // a, causal=True)
    assert flash.terms["recompute"] == 0
    assert (flash.terms["attention_f"], flash.terms["attention_b"]) == pytest.approx((4 * ff,
                                                                                      4 * fb))


@pytest.mark.parametrize("sp", [False, True])
def test_tensor_parallel_by_hand(sp):
    """t = 2: two all-reduces (or all-gather + reduce-scatter pairs) of s b h a layer forward,
    two backward, each moving 2 (t-1)/t of the buffer over NVLink; matmuls / t; attention on
    a / t heads; Megatron's loss all-reduces three s b fp32 vectors forward."""
    b, s, h, a, V, L = 1, 128, 256, 4, 1024, 4
    st = step_time.step_time(G, sm.Layout(tp=2, sp=sp), A100, "bf16", "none",
                             micro_batches=2, loss="fused", achievable=F)
    coll = 2 * (1 / 2) * s * b * h * 2 / NVLINK
    loss = 3 * 2 * (1 / 2) * 4 * s * b / NVLINK
    assert st.terms["tp_f"] == pytest.approx(2 * (2 * L * coll + loss))
    assert st.terms["tp_b"] == pytest.approx(2 * 2 * L * coll)
    af, _ = unfused(b, a // 2, s, h // a)
    assert st.terms["attention_f"] == pytest.approx(2 * L * af)
    lin = 24 * b * s * h * h / 2 / PEAK
    assert st.terms["matmul_f"] == pytest.approx(2 * (L * lin + 2 * b * s * h * V / 2 / PEAK))
    rep = 2 if sp else 1  # sequence parallelism splits the replicated element-wise work
    ew = ((4 * 2 + 2 * 7) * s * b * h // rep + 28 * s * b * h // 2) / HBM
    assert st.terms["elementwise_f"] == pytest.approx(2 * L * ew)
    # PyTorch's loss needs the logits gathered: (t-1)/t of s b V 16-bit values
    torch_loss = step_time.step_time(G, sm.Layout(tp=2, sp=sp), A100, "bf16", "none",
                                     micro_batches=2, loss="torch", achievable=F)
    assert torch_loss.terms["tp_f"] - st.terms["tp_f"] == pytest.approx(
        2 * ((1 / 2) * s * b * V * 2 - 3 * 2 * (1 / 2) * 4 * s * b) / NVLINK)


@pytest.mark.parametrize("v", [1, 2])
def test_pipeline_by_hand(v):
    """p = 2 (t = 2, d = 4: 16 GPUs, so the stages talk over InfiniBand), m = 4: per chunk
    one send forward and one backward of s b h / t (scatter/gather) and the NVLink all-gather
    after it; the last stage (the head) is the slowest; the bubble is (p - 1) / v of its
    micro-batch time."""
    b, s, h = 1, 128, 256
    lay = sm.Layout(dp=4, tp=2, pp=2, vp=v)
    st = step_time.step_time(G, lay, A100, "bf16", "none", micro_batches=4, achievable=F)
    share = s * b * h * 2 / 2
    p2p = v * 2 * (share / IB + (1 / 2) * s * b * h * 2 / NVLINK)
    assert st.parts["p2p"] == pytest.approx(p2p)
    assert st.terms["p2p"] == pytest.approx(4 * p2p)
    assert st.stage == 1  # the head makes the last stage the slowest
    assert st.terms["bubble"] == pytest.approx((2 - 1) / v * st.micro_batch_s)
    assert st.micro_batch_s == pytest.approx(sum(st.parts.values()))
    with pytest.raises(ValueError, match="multiple of p"):
        step_time.step_time(G, sm.Layout(pp=2, vp=2), A100, micro_batches=3)


def hierarchical(nbytes, members, nodes):
    """A reduce-scatter (or all-gather) of nbytes a GPU by hand: among the `members` on a node
    over NVLink, then the 1/members each holds among `nodes` nodes over the shared NICs."""
    return (members - 1) / members * nbytes / NVLINK \
        + (nodes - 1) / nodes * nbytes / members / IB


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_data_parallel_by_zero_stage(zero):
    """d = 8, t = 2: 16 GPUs, two nodes of 4 group members each: each collective reduce-
    scatters over NVLink among the 4, then across the 2 nodes over the NICs (d = 4, t = 2 fits
    a node: NVLink only). Bytes a GPU sends a step, m = 3: ZeRO-0 an all-reduce of the
    gradients, ZeRO-1 a reduce-scatter and an all-gather, ZeRO-2 a reduce-scatter per micro-batch
    and the all-gather, ZeRO-3 two all-gathers and a reduce-scatter per micro-batch. Nothing
    overlapped: every byte is on the critical path."""
    lay = sm.Layout(dp=8, tp=2, zero=zero)
    st = step_time.step_time(G, lay, A100, "bf16", "none", micro_batches=3, achievable=F,
                             overlap_dp=False)
    psi = G.params(2)
    ring = 7 / 8  # 3/4 inside the node + 1/2 of the quarter across: the ring's 7/8 still
    g, p = ring * psi * 2, ring * psi * 2  # 16-bit gradients and weights
    lay_p = ring * G.layers * G.layer_params(2) * 2  # the layers' weights alone
    want = {0: 2 * g, 1: g + p, 2: 3 * g + p, 3: 3 * (p + lay_p + g)}[zero]
    assert st.dp_bytes == pytest.approx(want)
    one = hierarchical(psi * 2, 4, 2)  # one reduce-scatter or all-gather of the stage
    # ZeRO-3: the root (embeddings, final norm, head) stays gathered from forward to backward,
    # the layers are gathered again for the backward
    layers = hierarchical(G.layers * G.layer_params(2) * 2, 4, 2)
    assert st.terms["dp_exposed"] == pytest.approx(
        {0: 2 * one, 1: 2 * one, 2: 4 * one, 3: 3 * (2 * one + layers)}[zero])
    # inside one node (d t = 8): NVLink
    node = step_time.step_time(G, sm.Layout(dp=4, tp=2, zero=zero), A100, "bf16", "none",
                               micro_batches=3, achievable=F, overlap_dp=False)
    assert node.terms["dp_exposed"] == pytest.approx(node.dp_bytes / NVLINK)


def test_zero2_reduce_scatter_hides_behind_each_backward_or_not():
    """With overlap, each micro-batch's reduce-scatter hides behind that micro-batch's
    backward; what is longer than the backward is exposed, m times."""
    big = sm.GPTShape(layers=4, hidden=1024, heads=8, seq=128, vocab=1024)
    lay = sm.Layout(dp=16, zero=2)
    st = step_time.step_time(big, lay, A100, "bf16", "none", micro_batches=5, achievable=F)
    psi = big.params()
    rs = ag = hierarchical(psi * 2, 8, 2)
    backward = st.micro_batch_s - (st.parts["matmul_f"] + st.parts["attention_f"]
                                   + st.parts["elementwise_f"] + st.parts["tp_f"])
    assert rs > backward  # this case is comm-bound
    assert st.terms["dp_exposed"] == pytest.approx(5 * (rs - backward) + ag)


def test_flash_wins_below_two_thirds_of_the_ridge():
    """GPT-2 small on an RTX 4090, d = 64 below the lab's 2R/3 (109 in bf16): the time model's
    FlashAttention is faster than standard attention, as the rule says."""
    gpt2 = sm.GPTShape(12, 768, 12, 1024, 50304)
    assert 64 < crossing.rule_of_thumb("4090", "bf16")
    t = {r: step_time.step_time(gpt2, sm.Layout(micro_batch=16), "4090", "bf16", r).step_s
         for r in ("none", "flash", "selective")}
    assert t["flash"] < t["none"] < t["selective"]


def test_flops_counts():
    """Narayanan's Eq. 3 is 4/3 of the model FLOPs' layer part (the recompute's forward)."""
    g = sm.GPTShape(96, 12288, 96, 2048, 51200)
    model = 72 * 8 * 96 * 2048 * 12288**2 * (1 + 2048 / (6 * 12288) + 51200 / (12 * 12288 * 96))
    assert step_time.model_flops(g, 8) == pytest.approx(model)
    assert step_time.narayanan_flops(g, 8) == pytest.approx(
        96 * 8 * 2048 * 96 * 12288**2 * (1 + 2048 / (6 * 12288) + 51200 / (16 * 96 * 12288)))
    assert roofline.peak_flops(A100, "bf16") == 312e12


@pytest.mark.parametrize("kw,message", [
    (dict(achievable=0), "achievable"), (dict(achievable=1.5), "achievable"),
    (dict(achievable=float("nan")), "achievable"), (dict(gpu="t4"), "no interconnect"),
    (dict(recompute="half"), "recompute"), (dict(loss="mse"), "loss"),
    (dict(micro_batches=0), "micro-batches m"), (dict(full_layers=9), "full_layers"),
])
def test_bad_input(kw, message):
    args = dict(gpu=A100, recipe="bf16", recompute="none", micro_batches=1)
    args.update(kw)
    with pytest.raises(ValueError, match=message):
        step_time.step_time(G, sm.Layout(), **args)


def test_without_dropout_the_dropout_launches_and_masks_go():
    """dropout=False: standard attention runs without its two dropout launches and the
    residual adds write no mask (2 bytes of s b h fewer); flash is unchanged."""
    b, s, h, a, L = 2, 128, 256, 4, 4
    kw = dict(micro_batches=1, achievable=F)
    on = step_time.step_time(G, sm.Layout(micro_batch=b), A100, "bf16", "none", **kw)
    off = step_time.step_time(G, sm.Layout(micro_batch=b), A100, "bf16", "none", dropout=False,
                              **kw)
    af, ab = unfused(b, a, s, h // a, dropout=False)
    assert (off.terms["attention_f"], off.terms["attention_b"]) == pytest.approx((L * af, L * ab))
    assert on.terms["attention_f"] > off.terms["attention_f"]
    assert on.terms["elementwise_f"] - off.terms["elementwise_f"] == pytest.approx(
        L * 2 * s * b * h / HBM)
    fl = [step_time.step_time(G, sm.Layout(micro_batch=b), A100, "bf16", "flash", dropout=d,
                              **kw).terms["attention_f"] for d in (True, False)]
    assert fl[0] == fl[1]
