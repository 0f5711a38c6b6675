"""Ports of PyTorch's checkpoint tests (test/test_utils.py, test_autograd.py: non-tensor
inputs and outputs, outputs that do not require grad) against ckptlab's engine checkpoint,
which follows PyTorch's non-reentrant semantics: fn may return values that are not Tensors
(returned as they are); an output requires grad only if it was computed from a tensor that
does; an input returned unchanged is returned as itself. Where PyTorch is installed, each case
is also run through torch.utils.checkpoint(use_reentrant=False) and must agree."""

import numpy as np
import pytest

from ckptlab.engine import Tensor
from ckptlab.recompute.checkpoint import checkpoint


def fresh(seed, shape=(3, 4), grad=True):
    return Tensor(np.random.default_rng(seed).standard_normal(shape), requires_grad=grad)


def test_non_tensor_outputs_are_returned_as_they_are():
    assert checkpoint(lambda a, b: (a * b, "bar"), 2.0, 3.0) == (6.0, "bar")
    assert checkpoint(lambda a: None, 2.0) is None
    x = fresh(0)
    assert checkpoint(lambda t: 5, x) == 5
    y, tag = checkpoint(lambda t, s: (t * 2.0, s), x, "bar")
    assert tag == "bar" and y.requires_grad


def test_an_input_without_grad_returned_as_the_output_does_not_require_grad():
    """PyTorch: the output is that input, requires_grad False, and backward() raises (before:
    it claimed to require grad and backward left x.grad None silently)."""
    x, y = fresh(1), fresh(2, grad=False)
    out = checkpoint(lambda a, b: b, x, y)
    assert out is y and not out.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        out.sum().backward()
    assert x.grad is None


def test_each_output_requires_grad_only_if_computed_from_one_that_does():
    x, y = fresh(3), fresh(4, grad=False)
    a, b, c = checkpoint(lambda p, q: (p * 2.0, q * 3.0, q), x, y)
    assert [a.requires_grad, b.requires_grad, c.requires_grad] == [True, False, False]
    assert c is y
    (a.sum() + b.sum()).backward()
    assert np.array_equal(x.grad, np.full(x.shape, 2.0))


def test_an_input_with_grad_returned_unchanged_is_itself():
    x, y = fresh(5), fresh(6)
    out = checkpoint(lambda a: a, x)
    assert out is x
    a, b = checkpoint(lambda p, q: (p, q * q), x, y)
    assert a is x and b.requires_grad
    (a.sum() + b.sum()).backward()
    assert np.array_equal(x.grad, np.ones(x.shape)) and np.allclose(y.grad, 2 * y.data)


def test_a_parameter_read_inside_gives_the_output_a_gradient():
    w = fresh(7, (4, 4))  # requires grad, not an argument
    y = fresh(8, grad=False)
    out = checkpoint(lambda q: q @ w, y)
    assert out.requires_grad
    out.sum().backward()
    assert np.allclose(w.grad, y.data.T @ np.ones((3, 4)))


def test_agrees_with_pytorch(torch):
    from torch.utils.checkpoint import checkpoint as pt_checkpoint

    def both(fn_engine, fn_torch, arrays, grads):
        e_in = [Tensor(a.copy(), requires_grad=g) for a, g in zip(arrays, grads, strict=True)]
        t_in = [torch.tensor(a.copy(), requires_grad=g) for a, g in zip(arrays, grads,
                                                                          strict=True)]
        e_out = checkpoint(fn_engine, *e_in)
        t_out = pt_checkpoint(fn_torch, *t_in, use_reentrant=False)
        e_out = e_out if isinstance(e_out, tuple) else (e_out,)
        t_out = t_out if isinstance(t_out, tuple) else (t_out,)
        assert [o.requires_grad for o in e_out] == [o.requires_grad for o in t_out]
        assert [any(o is x for x in e_in) for o in e_out] == \
            [any(o is x for x in t_in) for o in t_out]
        e_live = [o for o in e_out if o.requires_grad]
        t_live = [o for o in t_out if o.requires_grad]
        if not e_live:
            with pytest.raises(RuntimeError):
                e_out[0].sum().backward()
            with pytest.raises(RuntimeError):
                t_out[0].sum().backward()
            return
        sum(o.sum() for o in e_live).backward()
        sum(o.sum() for o in t_live).backward()
        for e, t in zip(e_in, t_in, strict=True):
            assert (e.grad is None) == (t.grad is None)
            if e.grad is not None:
                assert np.allclose(e.grad, t.grad.numpy())

    arrays = [np.random.default_rng(9).standard_normal((3, 4)) for _ in range(2)]
    both(lambda a, b: b, lambda a, b: b, arrays, (True, False))
    both(lambda a, b: (a * 2.0, b * 3.0), lambda a, b: (a * 2.0, b * 3.0), arrays,
         (True, False))
    both(lambda a, b: (a, b * b), lambda a, b: (a, b * b), arrays, (True, True))
    both(lambda a, b: a * b, lambda a, b: a * b, arrays, (False, True))
    assert pt_checkpoint(lambda a, b: (a * b, "bar"), 2.0, 3.0, use_reentrant=False) == \
        checkpoint(lambda a, b: (a * b, "bar"), 2.0, 3.0)
