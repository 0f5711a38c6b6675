"""Every op of the engine: gradients against central differences in float64 (gradcheck), the
attention op against a loop-by-loop reference, what each op's closure keeps alive, FLOP counts,
and the error messages for wrong shapes."""

import math

import numpy as np
import pytest

from ckptlab import engine, rng
from ckptlab.engine import Tensor, gradcheck, layers, ops
from ckptlab.recompute import ledger

R = np.random.default_rng(42)


def leaf(*shape, low=None):
    data = R.standard_normal(shape) if low is None else R.uniform(low, low + 1.0, shape)
    return Tensor(data, requires_grad=True)


# ------------------------------------------------------------------------------ gradcheck

CASES = {
    "add_broadcast": (lambda a, b: a + b, [(3, 4, 5), (4, 1)]),
    "sub_broadcast": (lambda a, b: a - b, [(2, 3), (3,)]),
    "mul_broadcast": (lambda a, b: a * b, [(2, 3, 4), (1, 3, 1)]),
    "div_broadcast": (lambda a, b: a / b, [(2, 3), "pos(3,)"]),
    "scalar_ops": (lambda a: (2.0 - a) * 3.0 / (a + 5.0), [(4,)]),
    "neg": (lambda a: -a, [(3,)]),
    "matmul_2d": (lambda a, b: a @ b, [(3, 4), (4, 5)]),
    "matmul_batched": (lambda a, b: ops.matmul(a, b), [(2, 3, 4), (2, 4, 5)]),
    "matmul_shared_weight": (lambda a, b: ops.matmul(a, b), [(2, 3, 4), (4, 2)]),
    "matmul_broadcast_batch": (lambda a, b: ops.matmul(a, b), [(2, 1, 3, 4), (3, 4, 2)]),
    "linear": (lambda x, W, b: ops.linear(x, W, b), [(2, 3, 4), (4, 5), (5,)]),
    "linear_no_bias": (lambda x, W: ops.linear(x, W), [(3, 4), (4, 2)]),
    "sum_all": (lambda x: x.sum(), [(3, 4)]),
    "sum_axis": (lambda x: ops.sum(x, axis=(0, 2)), [(2, 3, 4)]),
    "mean_keepdims": (lambda x: ops.mean(x, axis=-1, keepdims=True), [(3, 4)]),
    "reshape": (lambda x: x.reshape(6, 2) * 1.5, [(3, 4)]),
    "transpose": (lambda x: ops.transpose(x, 2, 0, 1), [(2, 3, 4)]),
    "split_merge_heads": (lambda x: ops.merge_heads(ops.split_heads(x, 2) * 2.0), [(2, 3, 4)]),
    "relu": (lambda x: ops.relu(x), [(4, 5)]),
    "gelu": (lambda x: ops.gelu(x), [(4, 5)]),
    "tanh": (lambda x: ops.tanh(x), [(4, 5)]),
    "exp": (lambda x: ops.exp(x), [(4, 5)]),
    "log": (lambda x: ops.log(x), ["pos(4, 5)"]),
    "softmax": (lambda x: ops.softmax(x, axis=-1), [(3, 5)]),
    "softmax_axis0": (lambda x: ops.softmax(x, axis=0), [(3, 5)]),
    "layernorm": (lambda x, w, b: layers.layernorm(x, w, b), [(2, 3, 6), (6,), (6,)]),
    "layernorm_plain": (lambda x: layers.layernorm(x), [(4, 6)]),
    "dropout": (lambda x: layers.dropout(x, 0.3), [(5, 7)]),
    "cross_entropy": (lambda z: layers.cross_entropy(z, np.array([[1, 0, 4], [2, 2, 3]])),
                      [(2, 3, 5)]),
}


def _inputs(specs):
    out = []
    for s in specs:
        if isinstance(s, str):  # "pos(shape)": values in [0.5, 1.5), away from log's pole
            out.append(leaf(*eval(s[3:]), low=0.5))
        else:
            out.append(leaf(*s))
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradcheck(name):
    fn, specs = CASES[name]
    assert gradcheck(fn, _inputs(specs))


def test_gradcheck_embedding_with_repeated_indices():
    W = leaf(6, 3)
    idx = np.array([[0, 5, 0], [2, 5, 5]])  # repeats: their gradients must add up
    assert gradcheck(lambda W: layers.embedding(W, idx), [W])


@pytest.mark.parametrize("impl", ["naive", "flash"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Nq,Nk", [(5, 5), (3, 6), (6, 3), (1, 4)])
def test_gradcheck_attention(impl, causal, Nq, Nk):
    q, k, v = leaf(2, 2, Nq, 3), leaf(2, 2, Nk, 3), leaf(2, 2, Nk, 3)
    assert gradcheck(lambda q, k, v: layers.attention(q, k, v, causal=causal, impl=impl), [q, k, v])


@pytest.mark.parametrize("impl", ["naive", "flash"])
def test_gradcheck_attention_with_dropout(impl):
    q, k, v = leaf(1, 2, 4, 3), leaf(1, 2, 5, 3), leaf(1, 2, 5, 3)
    assert gradcheck(lambda q, k, v: layers.attention(q, k, v, causal=True, impl=impl,
                                                   dropout_p=0.25, scale=0.7), [q, k, v])


def test_gradcheck_catches_a_wrong_gradient():
    def bad_square(x):  # claims d(x^2)/dx = x instead of 2x
        xn = x.node

        def backward(g):
            xn.add_grad(g * X)

        X = x.data
        return engine.tensor.make(x.data * x.data, "bad", (x,), backward, saved=(x,))

    with pytest.raises(AssertionError, match="analytic"):
        gradcheck(bad_square, [leaf(3)])


# ------------------------------------------------------------------------------ attention


def reference_attention(q, k, v, causal, scale, p, seed, offset):
    """Loops over (b, h, i): the row softmax of the masked scores, dropout element
    ((b*H + h)*Nq + i)*Nk + j from Philox, then the weighted sum of V's rows."""
    B, H, Nq, d = q.shape
    Nk = k.shape[2]
    O = np.zeros((B, H, Nq, v.shape[3]))
    for b in range(B):
        for h in range(H):
            for i in range(Nq):
                js = [j for j in range(Nk) if not causal or j <= i + Nk - Nq]
                if not js:
                    continue  # a fully masked row: O = 0
                s = np.array([scale * q[b, h, i] @ k[b, h, j] for j in js])
                w = np.exp(s - s.max())
                w /= w.sum()
                for w_j, j in zip(w, js, strict=True):
                    index = ((b * H + h) * Nq + i) * Nk + j
                    word = int(rng.random_words(seed, offset, np.array([index]))[0])
                    if p == 0 or (word >> 8) >= rng.threshold(p):
                        O[b, h, i] += w_j / (1 - p) * v[b, h, j]
    return O


@pytest.mark.parametrize("impl", ["naive", "flash"])
@pytest.mark.parametrize("causal,Nq,Nk", [(False, 4, 4), (True, 3, 5), (True, 5, 3)])
def test_attention_matches_loop_reference(impl, causal, Nq, Nk):
    q, k, v = leaf(2, 2, Nq, 3), leaf(2, 2, Nk, 3), leaf(2, 2, Nk, 3)
    engine.manual_seed(11)
    O = layers.attention(q, k, v, causal=causal, impl=impl, dropout_p=0.3)
    ref = reference_attention(q.data, k.data, v.data, causal, 1 / math.sqrt(3), 0.3, 11, 0)
    np.testing.assert_allclose(O.data, ref, rtol=1e-12, atol=1e-14)  # float64 both ways


def test_naive_and_flash_agree_and_masked_rows_are_zero():
    q, k, v = leaf(1, 2, 6, 4), leaf(1, 2, 3, 4), leaf(1, 2, 3, 4)
    dO = R.standard_normal((1, 2, 6, 4))
    grads = {}
    for impl in ("naive", "flash"):
        for t in (q, k, v):
            t.grad = None
        O = layers.attention(q, k, v, causal=True, impl=impl)
        O.backward(dO)
        assert np.all(O.data[:, :, :3] == 0.0)  # rows 0..2 see no key (bottom-right mask)
        grads[impl] = [t.grad.copy() for t in (q, k, v)]
        assert all(np.isfinite(g).all() for g in grads[impl])
        assert np.all(q.grad[:, :, :3] == 0.0)
    for a, b in zip(grads["naive"], grads["flash"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_ledger_shows_naive_keeps_P_and_flash_keeps_O_and_L():
    B, H, N, d = 2, 3, 16, 4
    q, k, v = (Tensor(R.standard_normal((B, H, N, d)), requires_grad=True, param=False)
               for _ in range(3))
    qkv = 3 * B * H * N * d * 8
    expected = {"naive": qkv + B * H * N * N * 8, "flash": qkv + B * H * N * d * 8 + B * H * N * 8}
    for impl, nbytes in expected.items():
        with ledger.record() as led:
            O = layers.attention(q, k, v, impl=impl)
            assert led.bytes == nbytes
            O.backward(np.ones_like(O.data))
            assert led.bytes == 0
        if impl == "flash":  # S = Q K^T: 2 N^2 d per head (matmul FLOPs only, as traffic.py)
            assert led.flops["recompute"] == 2 * B * H * N * N * d


def test_kernels_backend_matches_numpy_backend():
    """The attention op on the kernels (the emulator here) against its NumPy backend."""
    for impl in ("naive", "flash"):
        q, k, v = (Tensor(R.standard_normal((1, 2, 17, 16)), requires_grad=True)
                   for _ in range(3))  # d = 16: the kernels' smallest head dim
        dO = R.standard_normal((1, 2, 17, 16))
        out = {}
        for backend in ("numpy", "kernels"):
            for t in (q, k, v):
                t.grad = None
            engine.manual_seed(3)
            O = layers.attention(q, k, v, causal=True, impl=impl, dropout_p=0.1, backend=backend)
            O.backward(dO)
            out[backend] = [O.data] + [t.grad for t in (q, k, v)]
        for a, b in zip(out["numpy"], out["kernels"], strict=True):  # fp32 kernels, fp64 truth
            assert np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(a)


# ------------------------------------------------------------------------------ what closures hold


def _closure_arrays(fn):
    return [c.cell_contents for c in fn.__closure__ or ()]


@pytest.mark.parametrize("name", sorted(CASES))
def test_closures_hold_only_what_the_ledger_counts(name):
    """No closure may keep an input Tensor, or an array the ledger does not count (unless it
    is a parameter): otherwise the graph holds memory that no schedule can predict."""
    fn, specs = CASES[name]
    inputs = _inputs(specs)
    acts = [Tensor(t.data.copy(), requires_grad=True, param=False) for t in inputs]
    with ledger.record() as led:
        out = fn(*acts)
        held = {id(ledger.root_buffer(a)) for a, _, _ in led._held.values()}
        for cell in _closure_arrays(out.node.backward):
            assert not isinstance(cell, Tensor), f"{name}: closure holds a Tensor"
            if hasattr(cell, "nbytes") and hasattr(cell, "shape"):
                assert id(ledger.root_buffer(cell)) in held, f"{name}: uncounted {cell.shape}"


@pytest.mark.parametrize("impl", ["naive", "flash"])
def test_attention_closure_holds_only_what_the_ledger_counts(impl):
    q, k, v = (Tensor(R.standard_normal((1, 2, 5, 3)), requires_grad=True, param=False)
               for _ in range(3))
    with ledger.record() as led:
        out = layers.attention(q, k, v, causal=True, impl=impl, dropout_p=0.2)
        held = {id(ledger.root_buffer(a)) for a, _, _ in led._held.values()}
        for cell in _closure_arrays(out.node.backward):
            assert not isinstance(cell, Tensor)
            if hasattr(cell, "nbytes") and hasattr(cell, "shape"):
                assert id(ledger.root_buffer(cell)) in held


# ------------------------------------------------------------------------------ FLOPs, errors


def test_matmul_and_linear_flops():
    a, b = leaf(3, 4), leaf(4, 5)
    with ledger.record() as led:
        y = a @ b
        assert led.flops["forward"] == 2 * 3 * 4 * 5
        y.backward(np.ones((3, 5)))
        assert led.flops["backward"] == 2 * (2 * 3 * 4 * 5)  # da and db
    x = Tensor(R.standard_normal((3, 4)))  # no grad: dx is not computed nor counted
    with ledger.record() as led:
        y = ops.linear(x, b)
        y.backward(np.ones((3, 5)))
        assert led.flops == {"forward": 120, "recompute": 0, "backward": 120}


@pytest.mark.parametrize("call,pattern", [
    (lambda: leaf(3, 4) @ leaf(5, 6), r"\(3, 4\).*\(5, 6\)"),
    (lambda: leaf(3, 4) + leaf(5,), r"\(3, 4\) and \(5,\)"),
    (lambda: ops.linear(leaf(2, 3), leaf(4, 5)), r"x \(2, 3\).*W \(4, 5\)"),
    (lambda: ops.linear(leaf(2, 4), leaf(4, 5), leaf(4)), r"bias of shape \(4,\)"),
    (lambda: layers.layernorm(leaf(2, 4), leaf(3)), r"\(3,\) for x \(2, 4\)"),
    (lambda: layers.attention(leaf(1, 2, 3, 4), leaf(1, 2, 5, 3), leaf(1, 2, 5, 3)),
     r"q \(1, 2, 3, 4\), k \(1, 2, 5, 3\)"),
    (lambda: layers.cross_entropy(leaf(2, 5), np.array([1, 2, 3])), r"targets \(3,\).*\(2, 5\)"),
    (lambda: layers.cross_entropy(leaf(2, 5), np.array([1, 7])), r"\[0, 5\)"),
    (lambda: layers.embedding(leaf(4, 2), np.array([4])), r"\[0, 4\)"),
    (lambda: ops.reshape(leaf(3, 4), 5, 2), r"\(3, 4\) into \(5, 2\)"),
    (lambda: ops.split_heads(leaf(2, 3, 5), 2), r"heads=2.*\(2, 3, 5\)"),
    (lambda: layers.dropout(leaf(3), 1.0), r"\[0, 1\)"),
])
def test_bad_shapes_raise_errors_naming_them(call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call()
