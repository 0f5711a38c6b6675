"""ckptlab.torch on CUDA tensors: the kernels through CuPy and DLPack, on torch's current
stream. Skipped, with the reason, without a GPU (or without a CUDA build of PyTorch). Run
with `pytest -m gpu`. Same rule as on the emulator: relative error <= 1e-5 of float64 and at
most twice PyTorch's float32 error."""

import pytest
from torch_oracle import FLOOR, TOL, oracle, rel, torch  # skips this module without PyTorch

from ckptlab import device
from ckptlab.torch import METHODS, TorchLedger, arrays, attention, nets
from ckptlab.torch.schedule import make_schedule

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (device.cuda_available() and torch.cuda.is_available()),
                       reason="needs a GPU seen by both CuPy and a CUDA build of PyTorch"),
]
CASES = [(2, 100, 257, 64, True, 0.0), (1, 257, 64, 32, False, 0.2), (2, 17, 17, 128, True, 0.1),
         (1, 1, 100, 16, False, 0.0)]


def make(H, Nq, Nk, d, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(s, generator=g, device="cuda")
            for s in ((1, H, Nq, d), (1, H, Nk, d), (1, H, Nk, d), (1, H, Nq, d))]


def grads_of(fn, q, k, v, dO):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    O = fn(q, k, v)
    O.backward(dO)
    return [O.detach(), q.grad, k.grad, v.grad]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("c", CASES)
def test_cuda_tensors_match_float64(c, method):
    H, Nq, Nk, d, causal, p = c
    q, k, v, dO = make(H, Nq, Nk, d, seed=Nq + d)
    kw = dict(causal=causal, dropout_p=p, seed=5, offset=1)
    got = grads_of(lambda *a: attention(*a, method=method, **kw), q, k, v, dO)
    truth = grads_of(lambda *a: oracle(*a, **kw), *(t.double() for t in (q, k, v, dO)))
    fp32 = grads_of(lambda *a: oracle(*a, **kw), q, k, v, dO)
    for name, x, t, t32 in zip("O dQ dK dV".split(), got, truth, fp32, strict=True):
        assert x.device.type == "cuda" and torch.isfinite(x).all(), name
        err, err32 = rel(x, t), rel(t32, t)
        assert err <= TOL and err <= 2 * err32 + FLOOR, f"{method} {name}: {err:.1e}"


def test_launches_go_on_torchs_current_stream_without_copies():
    q, k, v, dO = make(2, 64, 64, 32)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        with arrays.on(q) as (to_array, _):
            cp = device.xp("cuda")
            assert cp.cuda.get_current_stream().ptr == side.cuda_stream
            assert to_array(q).data.ptr == q.data_ptr()  # a view, not a copy
        packed = []
        qs = [t.requires_grad_(True) for t in (q, k, v)]
        with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t,
                                                      lambda t: t):
            O = attention(*qs, causal=True)
        twice = O * 2  # ordered after the kernels on the same stream, no synchronisation
    side.synchronize()
    assert [t.data_ptr() for t in packed[:3]] == [t.data_ptr() for t in qs]
    assert packed[3].data_ptr() == O.data_ptr()  # flash saves its output itself
    assert torch.equal(twice, attention(*(t.detach() for t in qs), causal=True) * 2)


def test_a_budgeted_schedule_on_the_gpu():
    g = torch.Generator().manual_seed(0)
    model = nets.GPT(vocab=64, ctx=64, width=64, heads=2, layers=4, attn="flash").cuda()
    x = torch.randint(0, 64, (2, 64), generator=g).cuda()
    y = torch.randint(0, 64, (2, 64), generator=g).cuda()
    prof = model.profile(x, y)
    sched = make_schedule("optimal(40%)", 4, prof)
    with TorchLedger(model.parameters()) as led:
        model(x, y, schedule=sched).backward()
    assert led.peak == sched.predict(prof).peak_bytes
