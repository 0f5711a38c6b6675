"""torch.compile over ckptlab's attention: the kernels are custom operators
(ckptlab.torch.compiled, torch.library), so TorchDynamo records one call instead of tracing
into the launch wrappers' NumPy. A compiled function or model (backends "eager" and
"aot_eager", fullgraph=True: no graph break) gives the same outputs and gradients as the eager
call, bit for bit: both run the same launches."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: pip install -e "
                            "'.[torch]'")

from ckptlab import emu  # noqa: E402
from ckptlab import torch as ct  # noqa: E402

torch.set_num_threads(1)


def leaves(shape, seed, dtype=torch.float32, n=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to(dtype).requires_grad_(True) for _ in range(n)]


def run(fn, inputs, backend):
    """fn's outputs and the gradients of a fixed random projection of them, eager or compiled
    (None)."""
    f = fn if backend is None else torch.compile(fn, backend=backend, fullgraph=True)
    xs = [x.detach().clone().requires_grad_(True) for x in inputs]
    outs = f(*xs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    g = torch.Generator().manual_seed(99)
    w = torch.randn(outs[0].shape, generator=g).to(outs[0].dtype)
    (outs[0] * w).sum().backward()
    return [o.detach() for o in outs], [x.grad for x in xs]


def same(fn, inputs, backend):
    torch._dynamo.reset()
    with emu.settings(mode="fast"):
        want = run(fn, inputs, None)
        got = run(fn, inputs, backend)
    for a, b in zip(want[0] + want[1], got[0] + got[1], strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


class Tiny(torch.nn.Module):
    """One attention layer with projections: a model with parameters around the kernels."""

    def __init__(self, width=16, heads=2):
        super().__init__()
        torch.manual_seed(4)
        self.qkv, self.proj, self.heads = torch.nn.Linear(width, 3 * width), \
            torch.nn.Linear(width, width), heads

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(
            2, 0, 3, 1, 4).contiguous().unbind(0)
        o = ct.attention(q, k, v, causal=True, dropout_p=0.1, seed=7)
        return self.proj(o.transpose(1, 2).reshape(B, N, C))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_compiled_model_equals_eager(backend):
    torch._dynamo.reset()
    x = torch.randn(2, 11, 16, generator=torch.Generator().manual_seed(1))
    model = Tiny()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with emu.settings(mode="fast"):
        y = model(x)
        y.square().sum().backward()
        want = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        y2 = compiled(x)
        y2.square().sum().backward()
    assert torch.equal(y, y2)
    for a, p in zip(want, model.parameters(), strict=True):
        assert torch.equal(a, p.grad)


def test_attention_compiled_equals_eager():
    same(lambda q, k, v: ct.attention(q, k, v, causal=True), leaves((1, 2, 13, 16), 0),
         "aot_eager")


CASES = [
    ("naive", lambda q, k, v: ct.attention(q, k, v, method="naive", dropout_p=0.2, seed=3),
     (1, 2, 9, 8), torch.float32),
    ("stored one head", lambda q, k, v: ct.attention(q, k, v, method="stored", causal=True),
     (2, 10, 16), torch.float32),
    ("flash fp16, a seed over 2**63", lambda q, k, v: ct.attention(
        q, k, v, dropout_p=0.1, seed=2**63 + 5, offset=2**40, deterministic=True),
     (1, 2, 17, 16), torch.float16),
    ("with lse", lambda q, k, v: ct.attention_with_lse(q, k, v, causal=True, scale=0.3),
     (1, 1, 7, 24), torch.float32),
    ("flash_attn_func GQA", lambda q, k, v: ct.flash_attn_func(q, k[:, :, :1], v[:, :, :1],
                                                               causal=True),
     (1, 9, 2, 20), torch.float32),
    ("FlashAttention.apply", lambda q, k, v: ct.FlashAttention.apply(q, k, v, True),
     (2, 12, 16), torch.float32),
    ("StoredAttention.apply, Triton's call", lambda q, k, v: ct.StoredAttention.apply(
        q, k, v, False, 0.5, None), (1, 2, 9, 16), torch.float32),
    ("NaiveAttention.apply", lambda q, k, v: ct.NaiveAttention.apply(q, k, v), (1, 8, 8),
     torch.float32),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,fn,shape,dtype", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_every_entry_point_compiled_equals_eager(name, fn, shape, dtype, backend):
    same(fn, leaves(shape, len(name), dtype), backend)


def test_bad_options_under_compile_get_the_wrappers_errors():
    q, k, v = leaves((1, 1, 8, 8), 2)
    torch._dynamo.reset()
    f = torch.compile(lambda q, k, v: ct.attention(q, k, v, causal="yes"), backend="eager",
                      fullgraph=True)
    with pytest.raises(Exception, match="causal must be a bool"):
        f(q, k, v)
