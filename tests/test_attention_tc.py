"""The tensor-core attention kernels (kernels/attn_flash_*_tc.cu) against float64, by
FlashAttention's rule, on the fp32 tests' random grid plus head dims 40, 80, 96, 160, 256.

For O, dQ, dK, dV, with err = max |x - truth| (max-abs, as FlashAttention's tests):
    err(kernel) <= 2 * err(PyTorch in the same precision)
exactly as flash_attn's tests/test_flash_attn.py applies it: truth is attention_ref's default
(upcast=True), the attention of the same 16-bit inputs computed in fp32 and cast to the 16-bit
dtype (here ckptlab.reference in float32, then cast); the yardstick is attention_ref(upcast=
False, reorder_ops=True): S = q (k * scale)^T (reorder_ops scales k), the mask, softmax, dropout
(our Philox mask), P V, each op rounding to the 16-bit dtype, gradients by autograd. No slack is
added: the grid passes without one. torch.nn.functional.scaled_dot_product_attention's math
backend itself now upcasts 16-bit inputs to fp32 inside (PyTorch >= 2.5: its output matches fp32
attention rounded once), which is not the same precision: against it the kernels' error measured
up to 2.2x. Where the float64 truth is exactly 0 (every row sees one key: dQ = dK = 0, and
PyTorch's softmax backward cancels exactly) the rule cannot apply; there, as in the fp32 tests,
the kernels' max |dQ|, |dK| is bounded by what cancels: dS = dP - D, two fp32 sums of the same d
products dO_ic V_c in different orders (tensor cores, preprocess), each off by at most d eps32
sum_c |dO_ic V_c| (zero_bounds).
Known limit: D = rowsum(dO * O) is formed from the 16-bit O, as FlashAttention 2 does; that adds
to every dS of a row an error PyTorch's softmax backward does not have (it sums its own P dP).
Off this grid it can exceed the rule: fp16 dK reached 2.8x at (Nq, Nk, d) = (100, 64, 64),
causal, dropout 0.3, in one draw (six others: 0.5-1.5x; D's rounding alone gave most of it).
Also: L (fp32) within 1e-5 relative of float64; stored and flash bitwise equal (the stored
scores are fp32, the very S the flash backward recomputes); the deterministic dQ bitwise
reproducible under shuffled block orders. Outputs are NaN-poisoned by the wrappers.
The grid runs in the emulator's fast mode; tests/test_attention_tc_faults.py adds the race
check. The yardstick is PyTorch's own ops where PyTorch is installed; without it, the same ops
written out in NumPy (tests/lowp_yardstick.py), held to PyTorch's precision by a test here.
"""

import math

import lowp_yardstick
import ml_dtypes
import numpy as np
import pytest

from ckptlab import device, emu, rng
from ckptlab import reference as ref
from ckptlab.kernels import flash_tc

try:
    import torch
except ImportError:  # the yardstick is then lowp_yardstick's NumPy ops
    torch = None

EPS32 = float(np.finfo(np.float32).eps)
DTYPES = {"bfloat16": (ml_dtypes.bfloat16, "bfloat16"), "float16": (np.float16, "float16")}

# the fp32 tests' grid (tests/test_attention.py): (Nq, Nk) cycling through N in {1, 17, 64,
# 100, 257}, every head dim meets every (causal, dropout) pair, B*H alternating 1 and 2
PAIRS = [(1, 100), (17, 17), (257, 64), (64, 257), (100, 17), (17, 100), (257, 257), (100, 64)]
OPTIONS = [(False, 0.0), (True, 0.0), (False, 0.2), (True, 0.3)]


def grid(dims, first_dtype):
    other = {"bfloat16": "float16", "float16": "bfloat16"}
    cases = []
    for n, (d, (causal, p)) in enumerate((d, o) for d in dims for o in OPTIONS):
        dtype = first_dtype if n % 2 == 0 else other[first_dtype]
        cases.append((1, 1 + n % 2, *PAIRS[n % len(PAIRS)], d, causal, p, dtype))
    return cases


EXTRA = [  # the fp32 tests' edge cases
    (1, 1, 1, 1, 16, False, 0.0, "bfloat16"),  # one query, one key
    (1, 1, 257, 1, 64, False, 0.0, "float16"),  # one key per row: exact dQ = dK = 0
    (1, 2, 1, 100, 32, True, 0.0, "bfloat16"),  # one query, bottom-right: it sees every key
    (2, 1, 257, 100, 16, True, 0.15, "float16"),  # 157 rows that see no key, with dropout
    (1, 1, 64, 17, 128, True, 0.5, "bfloat16"),
]
QUICK = grid((16, 32, 64, 128), "bfloat16") + EXTRA
SLOW = grid((40, 80, 96, 160, 256), "bfloat16") + grid((16, 32, 64, 128), "float16")


def case_id(c):
    B, H, Nq, Nk, d, causal, p, dtype = c
    return f"{dtype}-BH{B * H}-Nq{Nq}-Nk{Nk}-d{d}-{'causal' if causal else 'full'}-p{p}"


def make_inputs(B, H, Nq, Nk, d, dtype, seed):
    g = np.random.default_rng(seed)
    return tuple(g.standard_normal(s).astype(dtype)
                 for s in ((B, H, Nq, d), (B, H, Nk, d), (B, H, Nk, d), (B, H, Nq, d)))


def torch_low_precision(q, k, v, dO, causal, p, seed, offset, tdtype):
    """O, dQ, dK, dV (float64 copies) of the math path's ops in the 16-bit dtype `tdtype`."""
    Nq, Nk, d = q.shape[2], k.shape[2], q.shape[3]
    tq, tk, tv = (torch.tensor(x.astype(np.float32)).to(tdtype).requires_grad_()
                  for x in (q, k, v))
    visible = torch.tensor(ref.causal_visible(Nq, Nk) if causal else np.ones((Nq, Nk), bool))
    s = tq @ (tk * (1.0 / math.sqrt(d))).transpose(-1, -2)  # reorder_ops=True: k is scaled
    # a row that sees no key is 0 (FlashAttention's rule); softmax over all -inf would be NaN,
    # and a NaN row would turn every column's dV and dK into NaN (then 0 by nan_to_num): a
    # yardstick error as large as the answer, against which any kernel passes
    none = ~visible.any(-1, keepdim=True)
    a = torch.softmax(s.masked_fill(~visible & ~none, float("-inf")), dim=-1).masked_fill(none, 0)
    if p > 0:  # the kernels' Philox mask, scaled as torch's dropout does
        a = (a * torch.tensor(rng.keep_mask(seed, offset, a.shape, p))) * (1.0 / (1.0 - p))
    o = a @ tv
    o.backward(torch.tensor(dO.astype(np.float32)).to(tdtype))
    # rows that see no key: NaN in PyTorch (softmax of all -inf), 0 by FlashAttention's rule
    return [torch.nan_to_num(x.detach()).double().numpy() for x in (o, tq.grad, tk.grad, tv.grad)]


def check(name, x, truth, yardstick, exact, zero_bound=0.0):
    """FlashAttention's rule: max |x - truth| <= 2 max |yardstick - truth|, truth the fp32
    attention cast to the 16-bit dtype; `exact` (float64) only tells where the answer is 0."""
    x = np.asarray(device.to_numpy(x)).astype(np.float64)
    assert np.all(np.isfinite(x)), f"{name}: NaN or inf (an unwritten element stays NaN)"
    if not exact.any():
        assert np.abs(x).max() <= zero_bound, f"{name}: exact answer is 0, got {abs(x).max()}"
        return
    err, err_pt = np.abs(x - truth).max(), np.abs(yardstick - truth).max()
    assert err <= 2 * err_pt, f"{name}: max error {err:.3e} > 2 x PyTorch's {err_pt:.3e}"


def zero_bounds(q, k, v, dO, scale):
    """(dQ, dK, dV) bounds on max |.| where every row sees one key (exact dQ = dK = 0):
    |dS_i| <= 2 d eps32 sum_c |dO_ic V_c| (two fp32 sums, see the header), times 1.01 for dS's
    rounding to 16 bits and the fp32 sums of dQ = scale dS K, dK = scale dS^T Q."""
    f = [a.astype(np.float64) for a in (q, k, v, dO)]
    d = q.shape[-1]
    ds = 2 * d * EPS32 * np.abs(f[3] * f[2]).sum(-1, keepdims=True)  # (B, H, Nq, 1), Nk = 1
    dq = 1.01 * scale * (ds * np.abs(f[1])).max()
    dk = 1.01 * scale * (ds * np.abs(f[0])).sum(-2).max()
    return dq, dk, 0.0


def run_case(c, seed=0):
    B, H, Nq, Nk, d, causal, p, dtype = c
    npdt, tdt = DTYPES[dtype]
    q, k, v, dO = make_inputs(B, H, Nq, Nk, d, npdt, seed)
    kw = dict(causal=causal, dropout_p=p, seed=1234 + seed, offset=7)
    f64 = [x.astype(np.float64) for x in (q, k, v, dO)]
    O64, L64 = ref.forward(*f64[:3], **kw)
    exact = [O64, *ref.backward(f64[3], *f64[:3], **kw)]
    f32 = dict(kw, dtype=np.float32)  # FlashAttention's truth: fp32, cast to the 16-bit dtype
    truth = [x.astype(npdt).astype(np.float64) for x in
             (ref.forward(*f64[:3], **f32)[0], *ref.backward(f64[3], *f64[:3], **f32))]
    if torch is not None:
        yard = torch_low_precision(q, k, v, dO, causal, p, kw["seed"], kw["offset"],
                                   getattr(torch, tdt))
    else:
        yard = lowp_yardstick.low_precision(q, k, v, dO, causal, p, kw["seed"], kw["offset"],
                                            npdt)

    O, saved = flash_tc.tc_forward("flash", q, k, v, **kw)
    Os, saved_s = flash_tc.tc_forward("stored", q, k, v, **kw)
    assert O.dtype == npdt and saved.tensors["L"].dtype == np.float32
    check("O", O, truth[0], yard[0], exact[0])
    L = saved.tensors["L"]
    assert np.array_equal(np.isposinf(L), np.isposinf(L64)), "L: +inf rows differ"
    fin = np.isfinite(L64)
    if fin.any():
        assert ref.rel_err(L[fin], L64[fin]) <= 1e-5  # fp32 statistics of exact-product sums
    assert np.array_equal(Os.view(np.uint16), O.view(np.uint16)), "stored O != flash O"
    assert np.array_equal(saved_s.tensors["L"], L)

    bounds = zero_bounds(q, k, v, dO, 1.0 / math.sqrt(d)) if Nk == 1 else (0.0,) * 3
    for det in (False, True):
        grads = flash_tc.tc_backward(dO, q, k, v, saved, deterministic=det)
        for name, g, t, y, e, zb in zip(("dQ", "dK", "dV"), grads, truth[1:], yard[1:],
                                        exact[1:], bounds, strict=True):
            assert g.dtype == npdt
            check(f"flash {name} (deterministic={det})", g, t, y, e, zb)
        grads_s = flash_tc.tc_backward(dO, q, k, v, saved_s, deterministic=det)
        for name, g, gs in zip(("dQ", "dK", "dV"), grads, grads_s, strict=True):
            # the same P either way; only the atomic dQ's order could differ (on a GPU)
            if det or name != "dQ" or device.target() == "emu":
                assert np.array_equal(gs.view(np.uint16), g.view(np.uint16)), f"stored {name}"


@pytest.mark.parametrize("c", QUICK, ids=case_id)
def test_grid(c):
    with device.use("emu"), emu.settings(mode="fast"):
        run_case(c)


@pytest.mark.slow
@pytest.mark.parametrize("c", SLOW, ids=case_id)
def test_grid_more_head_dims_and_the_other_dtype(c):
    with device.use("emu"), emu.settings(mode="fast"):
        run_case(c)


def test_deterministic_dq_is_reproducible_under_shuffled_blocks():
    q, k, v, dO = make_inputs(1, 2, 100, 64, 40, ml_dtypes.bfloat16, 3)
    with device.use("emu"), emu.settings(mode="fast", block_order="shuffled"):
        _, saved = flash_tc.tc_forward("flash", q, k, v, causal=True)
        a = flash_tc.tc_backward(dO, q, k, v, saved, deterministic=True)
        b = flash_tc.tc_backward(dO, q, k, v, saved, deterministic=True)
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x.view(np.uint16), y.view(np.uint16))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("causal,p", [(False, 0.0), (True, 0.3)])
def test_numpy_yardstick_has_pytorchs_precision(torch, dtype, causal, p):
    """Where PyTorch is missing the NumPy yardstick stands in: its error against the truth is
    PyTorch's within a factor of 1.25 either way, per output (it rounds the same ops; the sums
    inside an op may add in another order), so the 2x rule means the same with either."""
    npdt, tdt = DTYPES[dtype]
    B, H, Nq, Nk, d = 1, 2, 100, 64, 64
    q, k, v, dO = make_inputs(B, H, Nq, Nk, d, npdt, 11)
    kw = dict(causal=causal, dropout_p=p, seed=5, offset=7)
    f64 = [x.astype(np.float64) for x in (q, k, v, dO)]
    f32 = dict(kw, dtype=np.float32)
    truth = [x.astype(npdt).astype(np.float64) for x in
             (ref.forward(*f64[:3], **f32)[0], *ref.backward(f64[3], *f64[:3], **f32))]
    pt = torch_low_precision(q, k, v, dO, causal, p, 5, 7, getattr(torch, tdt))
    npy = lowp_yardstick.low_precision(q, k, v, dO, causal, p, 5, 7, npdt)
    for name, t, a, b in zip(("O", "dQ", "dK", "dV"), truth, pt, npy, strict=True):
        ea, eb = np.abs(a - t).max(), np.abs(b - t).max()
        assert ea / 1.25 <= eb <= 1.25 * ea, f"{name}: NumPy {eb:.3e} vs PyTorch {ea:.3e}"


def test_yardstick_is_attention_ref_with_reorder_ops(torch):
    """The yardstick is flash_attn's attention_ref(upcast=False, reorder_ops=True): S = q (k /
    sqrt(d))^T, softmax and P V in the 16-bit dtype. Written out here in flash_attn's
    (batch, seqlen, heads, d) einsums, it matches torch_low_precision's O bit for bit; scaling
    q instead (reorder_ops=False) gives different bits, so the check can tell the two apart
    (at a d whose 1 / sqrt(d) is not a power of two: there both orders are exact)."""
    B, H, Nq, Nk, d = 1, 2, 33, 40, 40
    q, k, v, dO = make_inputs(B, H, Nq, Nk, d, ml_dtypes.bfloat16, 5)
    O = torch_low_precision(q, k, v, dO, False, 0.0, 0, 0, torch.bfloat16)[0]
    tq, tk, tv = (torch.tensor(x.astype(np.float32)).to(torch.bfloat16).transpose(1, 2)
                  for x in (q, k, v))  # -> (batch, seqlen, heads, d)

    def attention_ref(reorder_ops):
        if reorder_ops:
            s = torch.einsum("bthd,bshd->bhts", tq, tk / math.sqrt(d))
        else:
            s = torch.einsum("bthd,bshd->bhts", tq / math.sqrt(d), tk)
        return torch.einsum("bhts,bshd->bthd", torch.softmax(s, dim=-1), tv).transpose(1, 2)

    assert np.array_equal(attention_ref(True).double().numpy(), O)
    assert not np.array_equal(attention_ref(False).double().numpy(), O)
