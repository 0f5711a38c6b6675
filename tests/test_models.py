"""The model zoo: gradients agree with PyTorch float64 autograd on the same weights and the same
dropout masks; every schedule gives bitwise the gradients of no checkpointing (dropout on);
the broken RNG mode does not."""

import numpy as np
import pytest

from ckptlab import engine, models
from ckptlab.engine import Tensor
from ckptlab.recompute import schedules

R = np.random.default_rng(11)


def mlp():
    return models.MLP(width=8, layers=5, dropout=0.25, seed=3), R.standard_normal((6, 8)), \
        R.integers(0, 8, 6)


def gpt(attn="flash", backend="numpy", width=8, heads=2):
    m = models.GPT(vocab=13, ctx=7, width=width, heads=heads, layers=3, dropout=0.2, attn=attn,
                   backend=backend, seed=4)
    return m, R.integers(0, 13, (2, 7)), R.integers(0, 13, (2, 7))


def engine_grads(model, x, y, schedule="none", **kwargs):
    engine.manual_seed(21)
    model.zero_grad()
    loss = model.loss(Tensor(x), y, schedule=schedule, **kwargs)
    loss.backward()
    return loss.item(), {k: g.copy() for k, g in model.grads().items()}


def close(got, want, rtol):
    """Relative Frobenius error of every gradient. The key bias bk has a true gradient of zero
    (a shift shared by a whole row of scores leaves softmax unchanged), so each error is
    measured against max(|want|, 1e-3 x the largest gradient's norm)."""
    floor = 1e-3 * max(np.linalg.norm(g) for g in want.values())
    return [k for k, g in got.items()
            if not np.linalg.norm(g - want[k]) <= rtol * max(np.linalg.norm(want[k]), floor)]


def torch_grads(model, x, y, torch):
    engine.manual_seed(21)  # the twin reads the engine's RNG state for its mask offsets
    stages, params = models.torch_stages(model, y)
    h = torch.as_tensor(x)
    for stage in stages:
        h = stage(h)
    h.backward()
    return h.item(), {k: p.grad.numpy() for k, p in params.items()}


CASES = {"mlp": mlp, "gpt-flash": lambda: gpt("flash"), "gpt-naive": lambda: gpt("naive")}


@pytest.mark.parametrize("case", sorted(CASES))
def test_gradients_agree_with_pytorch_float64(case, torch):
    """Same weights, same masks, different code: float64 rounding differs by ~1e-16 per op,
    so every gradient agrees to 1e-12 relative (Frobenius)."""
    model, x, y = CASES[case]()
    loss, grads = engine_grads(model, x, y)
    t_loss, t_grads = torch_grads(model, x, y, torch)
    assert loss == pytest.approx(t_loss, rel=1e-13)
    assert close(grads, t_grads, 1e-12) == []


SCHEDULE_SPECS = ["sqrt", "every(2)", "uniform(2)", "revolve(1)", "revolve(2)",
                  "selective(matmul)", "optimal(60%)", "chen_greedy(20000)"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_schedule_gives_bitwise_the_same_gradients(case):
    model, x, y = CASES[case]()
    prof = model.profile(x, y, policies=["matmul"])
    loss, base = engine_grads(model, x, y)
    for spec in SCHEDULE_SPECS:
        if spec.startswith("chen") and case == "mlp":
            spec = "chen_greedy(2500)"
        sched = schedules.make(spec, prof=prof)
        l2, grads = engine_grads(model, x, y, sched)
        assert l2 == loss, spec
        for name, g in grads.items():
            assert np.array_equal(g, base[name]), f"{spec}: {name}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_broken_rng_mode_changes_the_gradients(case):
    model, x, y = CASES[case]()
    loss, base = engine_grads(model, x, y)
    l2, grads = engine_grads(model, x, y, "sqrt", preserve_rng_state=False)
    assert l2 == loss  # the forward is untouched: the bug is silent
    assert any(not np.array_equal(g, base[k]) for k, g in grads.items())


def test_naive_and_flash_attention_train_the_same_gpt():
    m, x, y = gpt("naive")
    _, naive = engine_grads(m, x, y)
    m.attn = "flash"
    m.blocks = [m._block(i) for i in range(m.layers)]
    _, flash = engine_grads(m, x, y)
    for k in naive:  # P/l versus exp(S - L): the same value to a few ulps
        np.testing.assert_allclose(naive[k], flash[k], rtol=1e-12, atol=1e-14)


def test_gpt_on_the_attention_kernels():
    """The attention op on ckptlab.kernels's fp32 kernels (the emulator on a CPU) against the
    float64 NumPy backend: relative error per gradient within 1e-4 (fp32 through 3 layers)."""
    ref, x, y = gpt("flash", "numpy", width=32, heads=2)  # d = 16, the kernels' smallest
    _, want = engine_grads(ref, x, y)
    for attn in ("naive", "flash"):
        m, _, _ = gpt(attn, "kernels", width=32, heads=2)
        _, got = engine_grads(m, x, y, "sqrt")
        assert close(got, want, 1e-4) == [], attn


def test_model_arguments_are_checked():
    with pytest.raises(ValueError, match="divisible"):
        models.GPT(width=10, heads=3)
    m, x, y = gpt()
    with pytest.raises(ValueError, match="longer than ctx=7"):
        m.loss(Tensor(R.integers(0, 13, (1, 9))), R.integers(0, 13, (1, 9)))
