"""What checkpoint() refuses and what it passes through, as torch.utils.checkpoint does: the
default determinism check (a recompute that runs other ops raises, even when the output shape
is the same), inputs changed in place (inside fn, or between forward and backward), a graph in
which nothing requires grad, non-Tensor arguments and tuple outputs."""

import numpy as np
import pytest

from ckptlab.engine import Tensor, layers, ops
from ckptlab.recompute import ledger
from ckptlab.recompute.checkpoint import DeterminismError, checkpoint

R = np.random.default_rng(8)
W_DATA = R.standard_normal((5, 5)) / np.sqrt(5)
X0 = R.standard_normal((4, 5))
W = None  # the weight (a Tensor): made by the fixture, once the test has pinned its target


@pytest.fixture(autouse=True)
def weight(_target):
    global W
    W = Tensor(W_DATA.copy(), requires_grad=True)
    yield W


def fresh():
    W.grad = None
    return Tensor(X0.copy(), requires_grad=True, param=False)  # an activation: the ledger counts it


def grads(x):
    return [x.grad.copy(), W.grad.copy()]


def changes_on_recompute(first, second):
    """fn that runs `first` on its first call and `second` afterwards."""
    calls = []

    def fn(x):
        calls.append(1)
        return (first if len(calls) == 1 else second)(x)

    return fn


# ------------------------------------------------------------------------------ other ops


@pytest.mark.parametrize("first,second,where", [
    (lambda x: ops.relu(ops.linear(x, W)), lambda x: ops.tanh(ops.linear(x, W)),
     r"op 1 was relu -> \(4, 5\) float64 in the first forward, tanh -> \(4, 5\) float64"),
    (lambda x: ops.linear(x, W) * 2.0, lambda x: ops.linear(x * 1.0, W) * 2.0,
     r"op 0 was linear .* mul -> \(4, 5\)"),
    (lambda x: ops.linear(x, W), lambda x: ops.relu(ops.linear(x, W)),
     r"\(2 ops, the first pass 1\).*op 1 was nothing"),
], ids=["another op", "one more op", "an op added at the end"])
def test_a_recompute_that_runs_other_ops_raises(first, second, where):
    """The output's shape and dtype are the same each time, so a shape check passes and the
    gradient is silently that of `second` at the first pass's output; like PyTorch's default
    check (it compares what each op saves), the ops must match."""
    x = fresh()
    y = checkpoint(changes_on_recompute(first, second), x)
    with pytest.raises(DeterminismError, match=where):
        y.sum().backward()


def test_none_skips_the_check_and_the_gradient_is_the_recomputes():
    """determinism_check="none": what the default check prevents, shown."""
    x = fresh()
    relu_then_tanh = changes_on_recompute(lambda t: ops.relu(ops.linear(t, W)),
                                          lambda t: ops.tanh(ops.linear(t, W)))
    checkpoint(relu_then_tanh, x, determinism_check="none").sum().backward()
    wrong = grads(x)
    x = fresh()
    ops.tanh(ops.linear(x, W)).sum().backward()
    assert all(np.array_equal(a, b) for a, b in zip(wrong, grads(x), strict=True))


# ------------------------------------------------------------------------------ inputs changed


@pytest.mark.parametrize("check", ["default", "value"])
def test_an_input_changed_between_forward_and_backward_raises(check):
    """Not a wrong gradient, and under "value" not a message blaming dropout: the input's
    bytes are checksummed at the forward and compared before the recompute."""
    x = fresh()
    y = checkpoint(lambda t: ops.relu(ops.linear(t, W)), x, determinism_check=check)
    x.data[1, 2] += 1.0
    with pytest.raises(DeterminismError, match="changed in place between the forward and the "
                                               "backward") as e:
        y.sum().backward()
    assert "argument 0 (shape (4, 5))" in str(e.value) and "dropout" not in str(e.value)


def test_an_input_changed_inside_fn_raises_at_the_forward():
    def scales_its_input(t):
        t.data *= 2.0  # in place: the recompute would start from the doubled values
        return ops.linear(t, W)

    with pytest.raises(DeterminismError, match="fn changed it in place during the first"):
        checkpoint(scales_its_input, fresh())


def test_the_value_check_still_names_a_redrawn_mask():
    x = fresh()
    y = checkpoint(lambda t: layers.dropout(ops.linear(t, W), 0.5), x,
                   preserve_rng_state=False, determinism_check="value")
    with pytest.raises(DeterminismError, match="unchanged inputs.*preserve_rng_state=False"):
        y.sum().backward()


# ------------------------------------------------------------------------------ no grad


def test_nothing_requires_grad_then_backward_raises():
    """Neither the input nor anything fn reads requires grad: the output has no graph, and
    backward() through it raises (PyTorch: "element 0 of tensors does not require grad")
    rather than recomputing and handing nothing to anybody."""
    y = checkpoint(lambda t: ops.relu(t * 2.0), Tensor(X0.copy()))
    assert not y.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        y.sum().backward()


def test_an_input_without_grad_and_a_parameter_inside():
    """The input wants no gradient but fn reads W, which does: W gets its gradient."""
    W.grad = None
    ops.relu(ops.linear(Tensor(X0.copy()), W)).sum().backward()
    want = W.grad.copy()
    W.grad = None
    y = checkpoint(lambda t: ops.relu(ops.linear(t, W)), Tensor(X0.copy()))
    assert y.requires_grad
    y.sum().backward()
    assert np.array_equal(W.grad, want)


# ------------------------------------------------------------------------------ arguments, outputs


def block(x, mask, k, alpha):
    """Reads a None, an int and a float besides its Tensor argument."""
    y = ops.linear(x, W) * alpha
    for _ in range(k):
        y = ops.tanh(y)
    return y if mask is None else y * mask


def test_non_tensor_arguments_pass_through():
    x = fresh()
    block(x, None, 2, 0.5).sum().backward()
    want = grads(x)
    x = fresh()
    checkpoint(block, x, None, 2, 0.5).sum().backward()
    assert all(np.array_equal(a, b) for a, b in zip(grads(x), want, strict=True))


def test_keyword_arguments_reach_fn_and_their_tensors_get_gradients():
    """checkpoint(fn, x, k=2, mask=m): as PyTorch's non-reentrant checkpoint, keywords go to
    fn; a Tensor among them (here the mask, requiring grad) gets its gradient, bitwise that of
    the plain call; the recompute sees the same keywords."""
    m = Tensor(R.standard_normal((4, 5)), requires_grad=True, param=False)
    x = fresh()
    block(x, m, 2, alpha=0.5).sum().backward()
    want, dm = grads(x), m.grad.copy()
    x, m.grad = fresh(), None
    checkpoint(block, x, alpha=0.5, k=2, mask=m).sum().backward()
    assert all(np.array_equal(a, b) for a, b in zip(grads(x), want, strict=True))
    assert np.array_equal(m.grad, dm)


def two_outputs(x, scale):
    h = ops.linear(x, W)
    return ops.relu(h), "a label", ops.tanh(h) * scale


@pytest.mark.parametrize("use", ["both", "first", "second"])
def test_tuple_outputs(use):
    """Each output's gradient reaches the one recompute; an output the loss does not use
    gets none. Bitwise the gradients without checkpointing."""
    def loss(outs):
        a, label, b = outs
        assert label == "a label"
        if use == "both":
            return a.sum() + (b * b).sum()
        return a.sum() if use == "first" else b.sum()

    x = fresh()
    loss(two_outputs(x, 3.0)).backward()
    want = grads(x)
    x = fresh()
    with ledger.record() as led:
        outs = checkpoint(two_outputs, x, 3.0)
        assert led.bytes == x.data.nbytes  # only the input is held until the backward
        loss(outs).backward()
        assert led.bytes == 0
    assert all(np.array_equal(a, b) for a, b in zip(grads(x), want, strict=True))
    assert led.flops["recompute"] > 0
