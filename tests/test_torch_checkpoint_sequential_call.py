"""ckptlab.torch.checkpoint_sequential takes PyTorch's call, (functions, segments, input,
use_reentrant=..., preserve_rng_state=...), and computes what torch.utils.checkpoint.
checkpoint_sequential computes: the same output and gradients bit for bit (dropout inside,
the RNG restored for each recompute), and the same modules recomputed (forward calls counted
by hooks), for every number of segments, reentrant or not, on an nn.Sequential and on a list."""

import warnings

import pytest
from torch_oracle import torch  # skips this module without PyTorch

from ckptlab.torch import TorchLedger, checkpoint_sequential

nn = torch.nn
L = 7


def chain():
    torch.manual_seed(0)
    layers = []
    for _ in range(L):
        layers += [nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Dropout(0.25))]
    return nn.Sequential(*layers)


def run(fn, model, x0):
    """Output, input and weight gradients, and forward calls per module, of fn(model, x)
    (counted as they start: a non-reentrant recompute stops inside the last module it needs,
    once every tensor it has to restore is made, so that call never returns)."""
    calls = [0] * len(model)
    hooks = [m.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
             for i, m in enumerate(model)]
    model.zero_grad(set_to_none=True)
    x = x0.clone().requires_grad_(True)
    torch.manual_seed(11)
    y = fn(model, x)
    y.square().sum().backward()
    for h in hooks:
        h.remove()
    return [y.detach(), x.grad, *(p.grad for p in model.parameters())], calls


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("segments", [1, 2, 3, 4, L])
def test_pytorchs_call_computes_what_pytorch_computes(segments, use_reentrant):
    model, x0 = chain(), torch.randn(4, 8)
    want, want_calls = run(lambda m, x: torch.utils.checkpoint.checkpoint_sequential(
        m, segments, x, use_reentrant=use_reentrant), model, x0)
    for functions in (model, list(model)):
        got, calls = run(lambda m, x, f=functions: checkpoint_sequential(
            f, segments, x, use_reentrant=use_reentrant), model, x0)
        assert calls == want_calls, (calls, want_calls)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    size = L // segments  # and the plan is PyTorch's: segments - 1 chunks recomputed
    assert want_calls == [2] * (size * (segments - 1)) + [1] * (L - size * (segments - 1))


def test_defaults_and_refusals():
    model, x0 = chain(), torch.randn(4, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # None means False here: no PyTorch warning either
        got, calls = run(lambda m, x: checkpoint_sequential(m, 3, x), model, x0)
    want, _ = run(lambda m, x: torch.utils.checkpoint.checkpoint_sequential(
        m, 3, x, use_reentrant=False), model, x0)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    x = x0.clone().requires_grad_(True)
    with pytest.raises(ValueError, match=r"segments: expected an int in \[1, 7\]"):
        checkpoint_sequential(model, 8, x)
    with pytest.raises(ValueError, match="accepted only with PyTorch's call"):
        checkpoint_sequential(model, x, "sqrt", use_reentrant=True)
    with pytest.raises(ValueError, match="need use_reentrant=False"), TorchLedger([]):
        checkpoint_sequential(model, 2, x, use_reentrant=True)
    # the RNG not restored: the recompute draws other dropout masks, as in PyTorch
    bad, _ = run(lambda m, x: checkpoint_sequential(m, 2, x, preserve_rng_state=False),
                 model, x0)
    assert torch.equal(bad[0], want[0]) and not torch.equal(bad[1], want[1])
