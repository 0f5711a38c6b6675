"""ckptlab.measure.unfused_attention: standard attention's launches as Megatron-LM and PyTorch's
math path run them, bytes per score worked by hand (6w + 1 forward, 9w + 1 backward), the four
GEMMs' FLOPs, dropout's two launches, the roofline per launch, and bad input refused."""

import pytest

from ckptlab.measure import timemodel
from ckptlab.measure import unfused_attention as ua

A100 = "A100-SXM4-80GB"


@pytest.mark.parametrize("w", [2, 4])
@pytest.mark.parametrize("dropout", [True, False])
def test_bytes_and_flops_by_hand(w, dropout):
    b, heads, s, d = 3, 5, 96, 40
    n, x = b * heads * s * s, b * heads * s * d
    fwd = ua.launches(b, heads, s, d, w, dropout, "forward")
    bwd = ua.launches(b, heads, s, d, w, dropout, "backward")
    # per score: S written, read by softmax, P written, (read by dropout, P' and mask written),
    # read by P V; Q, K read by the first GEMM, V read and O written by the last
    per = (6 * w + 1) if dropout else 4 * w
    assert sum(x_.bytes for x_ in fwd) == per * n + 4 * x * w
    per = (9 * w + 1) if dropout else 7 * w
    assert sum(x_.bytes for x_ in bwd) == per * n + 8 * x * w
    assert sum(x_.flops for x_ in fwd) == 2 * (2 * n * d)  # Q K^T and P V
    assert sum(x_.flops for x_ in bwd) == 4 * (2 * n * d)  # dP', dV, dQ, dK
    assert len(fwd) == (4 if dropout else 3) and len(bwd) == (6 if dropout else 5)
    assert any("dropout" in x_.name for x_ in fwd + bwd) == dropout


def test_seconds_are_the_roofline_of_each_launch():
    b, heads, s, d = 1, 12, 1024, 64
    f, bk = ua.seconds(b, heads, s, d, A100, "bf16", achievable=0.5)
    peak, hbm = 0.5 * 312e12, 2039e9
    each = [timemodel.LAUNCH_S + max(x.flops / peak, x.bytes / hbm)
            for x in ua.launches(b, heads, s, d, 2, True, "forward")]
    assert f == pytest.approx(sum(each))
    assert bk > f  # six launches, more bytes
    # at d = 64 (far below the ridge) even the GEMMs writing S are memory-bound
    s_gemm = ua.launches(b, heads, s, d, 2, True, "forward")[0]
    assert s_gemm.bytes / hbm > s_gemm.flops / peak


@pytest.mark.parametrize("kw,message", [
    (dict(b=0), "b:"), (dict(s=1.5), "s:"), (dict(d=True), "d:"), (dict(part="both"), "part"),
])
def test_bad_input(kw, message):
    args = dict(b=1, heads=2, s=8, d=4)
    args.update(kw)
    with pytest.raises(ValueError, match=message):
        ua.launches(**args)
    if "part" not in kw:
        with pytest.raises(ValueError, match=message):
            ua.seconds(gpu=A100, **args)
    with pytest.raises(ValueError, match="achievable"):
        ua.seconds(1, 2, 8, 4, A100, achievable=0)
    with pytest.raises(ValueError, match="dtype"):
        ua.seconds(1, 2, 8, 4, A100, dtype="int8")
