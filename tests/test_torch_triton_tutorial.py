"""Triton's fused-attention tutorial (python/tutorials/06-fused-attention.py, test_op), as its
test meets an autograd.Function: `attention = FlashAttention.apply`, then
`attention(q, k, v, causal, sm_scale, warp_specialize)` on (Z, H, N_CTX, HEAD_DIM) float16
inputs drawn from normal(0, 0.5), sm_scale = 0.5, against its reference (scores in float16,
softmax in float32 rounded to float16, top-left causal mask) within atol = 1e-2, rtol = 0 for
out, dV, dK and dQ. The reference is written here from the tutorial's conventions; N_CTX is
smaller than the tutorial's (the emulator runs on a CPU). Also checked against float64 (the
tutorial's tolerance alone would pass a kernel that ignored sm_scale's last digits), with
every method, and the 4-argument form CS336 uses."""

import pytest
from torch_oracle import torch  # skips this module without PyTorch

from ckptlab import emu
from ckptlab.torch import FlashAttention, NaiveAttention, StoredAttention

FUNCTIONS = {"flash": FlashAttention, "stored": StoredAttention, "naive": NaiveAttention}


def tutorial_reference(q, k, v, causal, sm_scale, dtype=torch.float16):
    """The tutorial's reference: p = q k^T * sm_scale (in the inputs' dtype), -inf above the
    diagonal when causal, softmax in float32 cast back, out = p v."""
    N = q.shape[2]
    M = torch.tril(torch.ones((N, N)))
    p = torch.matmul(q, k.transpose(2, 3)) * sm_scale
    if causal:
        p[:, :, M == 0] = float("-inf")
    p = torch.softmax(p.float(), dim=-1).to(dtype)
    return torch.matmul(p, v)


def inputs(Z, H, N, D, dtype, seed=20):
    torch.manual_seed(seed)
    q, k, v = (torch.empty((Z, H, N, D), dtype=dtype).normal_(mean=0.0, std=0.5)
               .requires_grad_() for _ in range(3))
    return q, k, v, torch.randn_like(q)


@pytest.mark.parametrize("warp_specialize", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_the_tutorials_test_op(causal, warp_specialize):
    Z, H, N_CTX, HEAD_DIM, sm_scale = 1, 2, 128, 64, 0.5
    q, k, v, dout = inputs(Z, H, N_CTX, HEAD_DIM, torch.float16)
    ref_out = tutorial_reference(q, k, v, causal, sm_scale)
    ref_out.backward(dout)
    ref = [ref_out, *(t.grad.clone() for t in (v, k, q))]
    for t in (q, k, v):
        t.grad = None
    attention = FlashAttention.apply
    with emu.settings(mode="fast"):
        tri_out = attention(q, k, v, causal, sm_scale, warp_specialize).half()
        tri_out.backward(dout)
    tri = [tri_out, v.grad, k.grad, q.grad]
    for name, a, b in zip(("out", "dv", "dk", "dq"), ref, tri, strict=True):
        assert b.dtype == torch.float16 and b.shape == a.shape, name
        assert torch.allclose(a, b, atol=1e-2, rtol=0), (name, float((a - b).abs().max()))

    # and against float64: within 2x the tutorial's float16 reference's own error
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    out64 = tutorial_reference(*leaves, causal, sm_scale, dtype=torch.float64)
    out64.backward(dout.double())
    truth = [out64.detach(), *(t.grad for t in leaves[::-1])]
    for name, a, b, t in zip(("out", "dv", "dk", "dq"), ref, tri, truth, strict=True):
        err, err_ref = (float((x.detach().double() - t).abs().max()) for x in (b, a))
        assert err <= 2 * err_ref + 2.0**-22 * float(t.abs().max()), (name, err, err_ref)


@pytest.mark.parametrize("method", ["flash", "stored", "naive"])
def test_every_method_takes_the_six_argument_call_and_its_scale(method):
    """sm_scale is used (two scales, two answers, each the reference's); the 4-argument call
    is the 6-argument call with sm_scale = 1/sqrt(d)."""
    q, k, v, dout = inputs(2, 2, 48, 32, torch.float32, seed=3)
    fn = FUNCTIONS[method].apply
    with emu.settings(mode="fast"):
        for scale in (0.3, 1.7):
            out = fn(q, k, v, True, scale, False)
            want = tutorial_reference(q, k, v, True, scale, dtype=torch.float32)
            torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
        four = fn(q, k, v, True)
        six = fn(q, k, v, True, 32 ** -0.5, None)
    assert torch.equal(four, six)
    g = torch.autograd.grad(six, (q, k, v), dout)
    want = torch.autograd.grad(tutorial_reference(q, k, v, True, 32 ** -0.5, torch.float32),
                               (q, k, v), dout)
    for a, b in zip(g, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_bad_extra_arguments_are_refused_before_any_launch():
    q, k, v, _ = inputs(1, 1, 16, 16, torch.float32)
    with emu.record() as rec:
        with pytest.raises(TypeError, match="warp_specialize must be a bool"):
            FlashAttention.apply(q, k, v, True, 0.5, "yes")
        with pytest.raises(ValueError, match="scale"):
            FlashAttention.apply(q, k, v, True, float("nan"))
    assert rec.launches == []
