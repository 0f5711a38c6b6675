"""ckptlab.torch.attention: the kernels as a torch.autograd.Function, on the emulator (CPU
tensors), against PyTorch in float64.

Each output (O, dQ, dK, dV) must be within the kernels' rule of the float64 oracle:
    relative Frobenius error <= 1e-5, and <= 2x the error of the same oracle in float32 + 2^-22
for every method, on odd sizes (N = 1, 17, 100, 257), Nq < Nk and Nq > Nk, causal and not,
dropout and not, every head dim. gradcheck needs float64 and the kernels are fp32, so: the
float64 oracle passes torch.autograd.gradcheck itself, and the kernels pass a directional
finite-difference check whose tolerance is the fp32 forward error over the step.
Also: the saved set seen by saved_tensors_hooks, the errors, the dropout seed's source."""

import numpy as np
import pytest
from torch_oracle import (  # skips without PyTorch
    FLOOR,
    TOL,
    lse_slack,
    oracle,
    rel,
    rule_violation,
    torch,
)

from ckptlab import emu, kernels
from ckptlab.torch import METHODS, attention

# (H, Nq, Nk, d, causal, dropout_p): four head dims (tests/test_attention.py covers every one the
# kernels take), each meeting every (causal, dropout) pair; (Nq, Nk) cycle through odd sizes.
PAIRS = [(1, 100), (17, 17), (257, 64), (64, 257), (100, 17), (17, 1), (100, 100)]
OPTIONS = [(False, 0.0), (True, 0.0), (False, 0.2), (True, 0.3)]
DIMS = [d for d in (16, 32, 64, 128) if d in kernels.HEAD_DIMS]
CASES = [(1 + n % 2, *PAIRS[n % len(PAIRS)], d, causal, p)
         for n, (d, causal, p) in enumerate((d, c, p) for d in DIMS for c, p in OPTIONS)]
CASES += [(1, 1, 1, 16, False, 0.0), (2, 40, 17, 32, True, 0.15)]  # 23 rows see no key


def case_id(c):
    H, Nq, Nk, d, causal, p = c
    return f"H{H}-Nq{Nq}-Nk{Nk}-d{d}-{'causal' if causal else 'full'}-p{p}"


def make(H, Nq, Nk, d, seed=0, dtype=torch.float32):
    g = np.random.default_rng(seed)
    return [torch.tensor(g.standard_normal(s), dtype=dtype)
            for s in ((1, H, Nq, d), (1, H, Nk, d), (1, H, Nk, d), (1, H, Nq, d))]


def grads_of(fn, q, k, v, dO):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    O = fn(q, k, v)
    O.backward(dO)
    return O.detach(), (q.grad, k.grad, v.grad)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("c", CASES, ids=case_id)
def test_gradients_match_pytorch_float64(c, method):
    H, Nq, Nk, d, causal, p = c
    q, k, v, dO = make(H, Nq, Nk, d, seed=Nq + Nk + d)
    kw = dict(causal=causal, dropout_p=p, seed=11, offset=3)
    got = grads_of(lambda *a: attention(*a, method=method, **kw), q, k, v, dO)
    truth = grads_of(lambda *a: oracle(*a, **kw), *(t.double() for t in (q, k, v, dO)))
    fp32 = grads_of(lambda *a: oracle(*a, **kw), q, k, v, dO)
    # stored and flash form P = exp(S - L) in the backward: L's rounding is theirs alone
    slack = {"O": 0.0, "dQ": 0.0, "dK": 0.0, "dV": 0.0}
    if method != "naive":
        slack.update(dQ=lse_slack(q, k, causal), dK=lse_slack(q, k, causal),
                     dV=lse_slack(q, k, causal))
    for name, x, t, t32 in zip(("O", "dQ", "dK", "dV"), (got[0], *got[1]),
                               (truth[0], *truth[1]), (fp32[0], *fp32[1]), strict=True):
        assert torch.isfinite(x).all(), f"{method} {name}: NaN (an element nobody wrote)"
        if float(t.norm()) == 0:  # dQ, dK with one key per row: exactly 0 (see test_attention)
            assert float(x.norm()) <= 1e-5 * float(truth[0].norm() * dO.norm()), name
            continue
        why = rule_violation(f"{method} {name}", x, t, t32, slack[name])
        assert why is None, why


@pytest.mark.parametrize("causal,p", [(False, 0.0), (True, 0.3)])
def test_the_float64_oracle_passes_gradcheck(causal, p):
    q, k, v, _ = make(2, 5, 7, 4, seed=1, dtype=torch.float64)
    inputs = tuple(t.requires_grad_(True) for t in (q, k, v))
    assert torch.autograd.gradcheck(lambda *a: oracle(*a, causal=causal, dropout_p=p, seed=2),
                                    inputs)


@pytest.mark.parametrize("method", METHODS)
def test_directional_finite_differences_in_fp32(method):
    """f(x) = sum(dO * O(x)), x = (q, k, v), direction u: the kernels' backward <grad, u>
    against the central difference [f(x + h u) - f(x - h u)] / 2h of the fp32 forward.
    The difference is bounded by three terms: the forward's rounding at x +- h u over the
    step (its error is <= 2x float32's + 2^-22, the rule the grid test holds it to, so
    |f32 - f64| <= ||dO|| (2 err32 + 2^-22) ||O||), the central difference's own truncation
    (measured on the float64 oracle), and the gradient's rounding (TOL ||grad|| ||u||). A
    wrong or misrouted gradient is off by O(1) of <grad, u>."""
    q, k, v, dO = make(2, 17, 33, 16, seed=5)
    kw = dict(causal=True, dropout_p=0.1, seed=3)
    u = [t / t.norm() for t in make(2, 17, 33, 16, seed=6)[:3]]
    h = 3e-2
    ckpt = lambda *a: attention(*a, method=method, **kw)  # noqa: E731
    ref = lambda *a: oracle(*a, **kw)  # noqa: E731

    def at(sign, fn, dtype):
        return fn(*((x + sign * h * d).to(dtype) for x, d in zip((q, k, v), u, strict=True)))

    def f(O):
        return float((dO.double() * O.double()).sum())

    rounding = 0.0
    for sign in (1, -1):
        O64, O32 = at(sign, ref, torch.float64), at(sign, ref, torch.float32)
        rounding += float(dO.norm()) * (2 * rel(O32, O64) + FLOOR) * float(O64.norm()) / (2 * h)
    _, grads = grads_of(ckpt, q, k, v, dO)
    _, g64 = grads_of(ref, *(t.double() for t in (q, k, v, dO)))
    analytic = sum(float((g.double() * d).sum()) for g, d in zip(grads, u, strict=True))
    exact = sum(float((g * d.double()).sum()) for g, d in zip(g64, u, strict=True))
    truncation = abs((f(at(1, ref, torch.float64)) - f(at(-1, ref, torch.float64))) / (2 * h)
                     - exact)
    gradient = TOL * float(sum(g.norm() ** 2 for g in g64) ** 0.5) * 3**0.5
    bound = rounding + truncation + gradient
    diff = abs((f(at(1, ckpt, torch.float32)) - f(at(-1, ckpt, torch.float32))) / (2 * h)
               - analytic)
    print(f"{method}: |FD - analytic| = {diff:.2e} <= {bound:.2e} (rounding {rounding:.1e}, "
          f"truncation {truncation:.1e}, gradient {gradient:.1e}); <grad, u> = {exact:.3e}")
    assert diff <= bound, f"{method}: |FD - analytic| = {diff:.3e} > {bound:.3e}"
    assert bound < 0.05 * abs(exact), f"bound {bound:.2e} vs <grad, u> = {exact:.2e}: too loose"


@pytest.mark.parametrize("method", METHODS)
def test_saved_tensors_are_the_inputs_and_the_kernels_saved_set(method):
    """Through saved_tensors_hooks: q, k, v (the very storages passed in) and tensors equal,
    bitwise and in shape, to what the launch wrapper's Saved holds; flash's O is the output."""
    q, k, v = (t.requires_grad_(True) for t in make(2, 30, 50, 16, seed=7)[:3])
    packed = []

    def pack(t):
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        O = attention(q, k, v, causal=True, method=method)
    _, saved = getattr(kernels, f"{method}_forward")(*(t.detach().numpy() for t in (q, k, v)),
                                                     causal=True)
    ptr = lambda t: t.untyped_storage().data_ptr()  # noqa: E731
    assert [ptr(t) for t in packed[:3]] == [ptr(q), ptr(k), ptr(v)]
    rest = packed[3:]
    assert len(rest) == len(saved.tensors)
    for t, (name, a) in zip(rest, saved.tensors.items(), strict=True):
        assert t.shape == a.shape and t.dtype == torch.float32, name
        assert np.array_equal(t.detach().numpy(), a, equal_nan=True), name  # masked S: NaN
        if name == "O":
            assert ptr(t) == ptr(O)
    assert sum(t.untyped_storage().nbytes() for t in rest) == saved.nbytes


def _no_launch(fn, error, message):
    with emu.record() as rec, pytest.raises(error, match=message):
        fn()
    assert rec.launches == []


BAD_D = next(d for d in (24, 12, 300) if d not in kernels.HEAD_DIMS)  # no kernel takes it


def test_bad_input_gets_the_wrappers_errors():
    q, k, v, _ = make(2, 9, 11, 16)
    cases = [
        (dict(q=q.double()), TypeError, "q must have dtype float32, got float64"),
        (dict(q=q.to(torch.float8_e4m3fn)), TypeError,
         r"q must have dtype float32 \(or float16 / bfloat16 for the tensor-core kernels\), "
         "got torch.float8_e4m3fn"),
        (dict(q=q.bfloat16()), TypeError, r"k must have the dtype of q \(bfloat16\), got float32"),
        (dict(k=k[0]), ValueError, "k must have rank 4"),
        (dict(v=v[..., :8].contiguous()), ValueError, "v must have the shape of k"),
        (dict(q=q.transpose(2, 3)), ValueError, r"q must be C-contiguous.*q.contiguous\(\)"),
        (dict(q=q.numpy()), TypeError, "q must be a torch.Tensor, got numpy.ndarray"),
        (dict(k=k.to("meta")), ValueError, "k is a meta tensor"),
        (dict(q=q.to("meta"), k=k.to("meta"), v=v.to("meta")), ValueError, "CPU tensor"),
        (dict(q=torch.zeros(1, 1, 9, BAD_D), k=torch.zeros(1, 1, 9, BAD_D),
              v=torch.zeros(1, 1, 9, BAD_D)), ValueError, "head dim d must be"),
    ]
    for change, error, message in cases:
        args = {**dict(q=q, k=k, v=v), **change}
        _no_launch(lambda a=args: attention(**a), error, message)
    for dtype in (torch.float16, torch.bfloat16):  # naive has no tensor-core kernel
        h = [t.to(dtype) for t in (q, k, v)]
        _no_launch(lambda h=h: attention(*h, method="naive"), TypeError,
                   r"q must have dtype float32, got (float16|bfloat16) \(this kernel is fp32 "
                   r"only; float16 and bfloat16 run on tensor cores with method 'stored' or "
                   r"'flash'\)")
    _no_launch(lambda: attention(q, k, v, method="fast"), ValueError, "method must be one of")
    _no_launch(lambda: attention(q, k, v, deterministic=1), TypeError, "deterministic")
    _no_launch(lambda: attention(q, k, v, dropout_p=1.0), ValueError, "dropout_p")
    _no_launch(lambda: attention(q, k, v, scale=float("nan")), ValueError, "scale")
    # a fifth positional value is scale in Triton's tutorial and dropout_p in SDPA: refused
    _no_launch(lambda: attention(q, k, v, True, 0.5), TypeError, "positional argument")


def test_dropout_seed_comes_from_torchs_generator():
    """seed=None: drawn from torch's CPU generator (so torch.manual_seed reproduces it, and
    checkpoint's RNG restore redraws it); dropout_p = 0 draws nothing; an explicit seed gives
    the launch wrapper's own result."""
    q, k, v, _ = make(1, 20, 20, 16, seed=2)
    runs = []
    for s in (1, 1, 2):
        torch.manual_seed(s)
        runs.append(attention(q, k, v, dropout_p=0.5))
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])
    state = torch.get_rng_state()
    attention(q, k, v)
    assert torch.equal(torch.get_rng_state(), state)
    O, _ = kernels.flash_forward(q.numpy(), k.numpy(), v.numpy(), dropout_p=0.5, seed=9,
                                 offset=4)
    assert np.array_equal(attention(q, k, v, dropout_p=0.5, seed=9, offset=4).numpy(), O)


def test_deterministic_dq_is_bitwise_whatever_the_block_order():
    q, k, v, dO = make(2, 40, 257, 32, seed=5)
    runs = []
    for seed in range(3):
        with emu.settings(block_order="shuffled", block_seed=seed):
            runs.append(grads_of(lambda *a: attention(*a, method="flash", deterministic=True),
                                 q, k, v, dO)[1])
    assert all(torch.equal(a, b) for r in runs[1:] for a, b in zip(runs[0], r, strict=True))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("method", ["stored", "flash"])
@pytest.mark.parametrize("causal", [False, True])
def test_16_bit_tensors_run_the_tensor_core_kernels_unchanged(dtype, method, causal):
    """float16 and bfloat16 CPU tensors reach the tensor-core kernels through zero-copy views
    (bfloat16: its bits as int16, then ml_dtypes.bfloat16) and come back bit for bit what the
    NumPy wrappers return on the same inputs; the kernels' accuracy is
    tests/test_attention_tc.py's (FlashAttention's rule), here a bound on the bridge: every
    output within a few 16-bit roundings of float64. bfloat16 used to be refused."""
    import ml_dtypes

    from ckptlab.kernels import flash_tc

    tdtype = getattr(torch, dtype)
    npdtype = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    q, k, v, dO = (t.to(tdtype) for t in make(2, 37, 50, 64, seed=3))
    O, grads = grads_of(lambda q, k, v: attention(q, k, v, causal=causal, method=method,
                                                  dropout_p=0.1, seed=9), q, k, v, dO)
    assert O.dtype == tdtype and all(g.dtype == tdtype for g in grads)

    def bits(t):  # numpy array of the tensor's bits
        return t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()

    a = [bits(t).view(npdtype) for t in (q, k, v, dO)]
    O_np, saved = flash_tc.tc_forward(method, *a[:3], causal=causal, dropout_p=0.1, seed=9)
    want = [O_np, *flash_tc.tc_backward(a[3], *a[:3], saved)]
    for name, got, w in zip(("O", "dQ", "dK", "dV"), (O, *grads), want, strict=True):
        assert np.array_equal(bits(got).view(np.uint16), w.view(np.uint16)), name
    with torch.no_grad():
        truth = oracle(*(t.double() for t in (q, k, v)), causal=causal, dropout_p=0.1, seed=9)
    eps = 2.0**-8 if dtype == "bfloat16" else 2.0**-11
    assert rel(O.double(), truth) < 8 * eps


def test_a_bfloat16_tensor_view_shares_memory():
    from ckptlab.torch import arrays

    t = torch.arange(6, dtype=torch.float32).bfloat16()
    a = arrays._numpy(t)
    assert a.dtype.name == "bfloat16" and a.ctypes.data == t.data_ptr()
    back = arrays._tensor(a)
    assert back.dtype == torch.bfloat16 and back.data_ptr() == t.data_ptr()
    assert torch.equal(back, t)
