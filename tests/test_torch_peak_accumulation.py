"""step_memory's peak (params + grads + optimizer + activations + transient) read against what a
PyTorch step really holds, measured by storage: with gradient accumulation (more than one
micro-batch) the gradients accumulated so far and the next micro-batch's saved activations are
held at once, so the sum is reached exactly, not an upper bound; with one micro-batch the full
gradients and the activations never coexist and the sum overstates, by at most the gradients."""

import pytest

torch = pytest.importorskip("torch")

from ckptlab.torch.ledger import TorchLedger  # noqa: E402


def held_peak(microbatches: int, seed: int = 0):
    """The most saved-activation plus gradient bytes held at once over one step of
    `microbatches` micro-batches (read after every forward and every gradient accumulation),
    the gradients' bytes, and one micro-batch's saved-activation peak."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(*[m for _ in range(4)
                                  for m in (torch.nn.Linear(48, 48), torch.nn.Tanh())])
    params = list(model.parameters())
    grad_bytes = sum(p.numel() * p.element_size() for p in params)
    led, peak = TorchLedger(params), 0

    def now() -> int:
        return led.bytes + sum(p.grad.untyped_storage().nbytes() for p in params
                               if p.grad is not None)

    def after_accumulate(_):
        nonlocal peak
        peak = max(peak, now())

    for p in params:
        p.register_post_accumulate_grad_hook(after_accumulate)
    for _ in range(microbatches):
        x = torch.randn(8, 48)
        with led:
            loss = model(x).square().mean()
        peak = max(peak, now())  # the forward done: its activations held, the grads so far
        loss.backward()
        del loss
    return peak, grad_bytes, led.peak


@pytest.mark.parametrize("m", [2, 3])
def test_with_accumulation_a_step_holds_grads_and_activations_at_once(m):
    peak, grads, activations = held_peak(m)
    assert activations > 0 and grads > 0
    assert peak == grads + activations


def test_with_one_microbatch_the_sum_overstates_by_at_most_the_grads():
    peak, grads, activations = held_peak(1)
    assert activations <= peak < grads + activations
    assert grads + activations - peak <= grads
