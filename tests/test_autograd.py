"""The engine itself: accumulation, topological order, no_grad, freeing the graph, what stays
alive, the RNG state, the ledger's bytes and FLOPs, gradcheck's own checks."""

import gc
import weakref

import numpy as np
import pytest

from ckptlab import engine
from ckptlab.engine import Tensor, layers, ops
from ckptlab.measure import roofline
from ckptlab.recompute import ledger

R = np.random.default_rng(7)


def leaf(*shape):
    return Tensor(R.standard_normal(shape), requires_grad=True)


def test_a_value_used_twice_accumulates_both_gradients():
    x = leaf(5)
    y = (x * x + x).sum()  # dy/dx = 2x + 1
    y.backward()
    # (1 + x) + x, in the order the closures ran: equal to 2x + 1 up to one rounding
    np.testing.assert_allclose(x.grad, 2 * x.data + 1, rtol=4e-16, atol=4e-16)


def test_gradients_accumulate_across_backward_calls_until_reset():
    x = leaf(3)
    (x * 2.0).sum().backward()
    (x * 3.0).sum().backward()
    np.testing.assert_array_equal(x.grad, np.full(3, 5.0))
    x.grad = None
    (x * 3.0).sum().backward()
    np.testing.assert_array_equal(x.grad, np.full(3, 3.0))


def test_inputs_without_grad_get_none_and_no_work():
    x, W = Tensor(R.standard_normal((2, 3))), leaf(3, 4)
    with ledger.record() as led:
        ops.linear(x, W).sum().backward()
    assert x.grad is None and W.grad is not None
    assert led.flops["backward"] == 2 * 2 * 3 * 4 + 0  # dW only (sum's backward is a copy)


def test_no_grad_builds_nothing():
    x = leaf(4)
    with engine.no_grad():
        y = ops.relu(x) * 2.0
    assert not y.requires_grad and y.node is None
    assert engine.is_grad_enabled()


def test_deep_chain_has_no_recursion_limit():
    x = leaf(2)
    y = x
    for _ in range(3000):  # 3000 nodes: a recursive topological sort would overflow
        y = y * 1.0
    y.sum().backward()
    np.testing.assert_array_equal(x.grad, np.ones(2))


def test_second_backward_through_a_freed_graph_raises():
    x = leaf(3)
    y = ops.tanh(x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="already freed"):
        y.backward()


def test_non_leaf_grads_are_dropped_unless_retained():
    x = leaf(3)
    h, k = x * 2.0, x * 3.0
    k.retain_grad()
    (h * k).sum().backward()
    assert h.grad is None
    np.testing.assert_array_equal(k.grad, h.data)


def test_unsaved_activations_are_freed_saved_ones_live_until_backward():
    """The graph holds Nodes, not Tensors: an activation nobody saved dies with its Tensor."""
    x, W = leaf(4, 8), leaf(8, 8)
    h = ops.linear(x, W)  # relu saves its output, not its input h
    y = ops.relu(h)
    h_ref, y_ref = weakref.ref(h.data), weakref.ref(y.data)
    del h
    gc.collect()
    assert h_ref() is None
    loss = y.sum()
    del y
    gc.collect()
    assert y_ref() is not None  # relu's node keeps it for the backward
    loss.backward()
    gc.collect()
    assert y_ref() is None


def test_backward_checks_the_seed_gradient():
    x = leaf(2, 3)
    with pytest.raises(ValueError, match="non-scalar"):
        (x * 2.0).backward()
    with pytest.raises(ValueError, match=r"\(3,\) for a tensor of shape \(2, 3\)"):
        (x * 2.0).backward(np.ones(3))
    with pytest.raises(RuntimeError, match="does not require grad"):
        Tensor(np.ones(2)).backward()


def test_tensor_constructor_errors():
    with pytest.raises(TypeError, match="floating"):
        Tensor(np.arange(3), requires_grad=True)
    with pytest.raises(TypeError, match="got a Tensor"):
        Tensor(Tensor(np.ones(2)))


def test_rng_offsets_advance_once_per_dropout_call():
    engine.manual_seed(5)
    x = Tensor(np.ones((4, 4)))
    a = layers.dropout(x, 0.5)
    assert engine.rng_state() == (5, 1)
    b = layers.dropout(x, 0.5)
    assert engine.rng_state() == (5, 2)
    assert not np.array_equal(a.data, b.data)
    layers.dropout(x, 0.0)  # the identity draws nothing
    assert engine.rng_state() == (5, 2)
    engine.set_rng_state((5, 0))
    np.testing.assert_array_equal(layers.dropout(x, 0.5).data, a.data)


# ------------------------------------------------------------------------------ ledger


def test_ledger_counts_shared_buffers_once_and_ends_at_zero():
    x = Tensor(R.standard_normal((3, 4)), requires_grad=True, param=False)  # an activation
    W = leaf(4, 4)  # a parameter: never counted
    with ledger.record() as led:
        h = ops.linear(x, W)  # saves x (for dW) and W (a parameter: skipped)
        a = ops.tanh(h)  # saves its output a
        b = a * a  # saves a twice: still one buffer
        assert led.bytes == x.data.nbytes + a.data.nbytes
        b.sum().backward()
        assert led.bytes == 0 and led.peak == x.data.nbytes + a.data.nbytes
    values, spans = led.timeline()
    assert max(values) == led.peak and values[-1] == 0
    assert [s[2] for s in spans] == ["forward", "backward"]


def test_ledger_flops_and_utilization():
    led = ledger.Ledger()
    led.add_flops(300, "forward")
    led.add_flops(600, "backward")
    led.add_flops(300, "recompute")
    assert led.model_flops == 900 and led.hardware_flops == 1200
    chip = {"fp32_flops": 1.8e9, "tensor16_flops": 1.8e9, "hbm_bytes_per_s": 1.0}
    assert roofline.utilization(led.model_flops, 1e-6, chip) == pytest.approx(0.5)  # MFU
    assert roofline.utilization(led.hardware_flops, 1e-6, chip) == pytest.approx(2 / 3)  # HFU
    with pytest.raises(ValueError, match="seconds"):
        roofline.utilization(1, 0.0, chip)


def test_gradcheck_refuses_float32():
    with pytest.raises(TypeError, match="float64"):
        engine.gradcheck(lambda x: x * 2.0, [Tensor(np.ones(3, np.float32), requires_grad=True)])


def test_float32_stays_float32():
    x = Tensor(R.standard_normal((2, 3)).astype(np.float32), requires_grad=True)
    y = ops.gelu(layers.layernorm(x * 2.0 + 1.0))
    assert y.dtype == np.float32
    y.sum().backward()
    assert x.grad.dtype == np.float32
