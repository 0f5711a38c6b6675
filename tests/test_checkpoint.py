"""checkpoint(): same gradients bit for bit, only the inputs held, nested checkpoints, the RNG
restored (and the broken mode that redraws), determinism checks, selective policies."""

import numpy as np
import pytest

from ckptlab import engine
from ckptlab.engine import Tensor, layers, ops
from ckptlab.recompute import ledger, schedules
from ckptlab.recompute.checkpoint import (
    DeterminismError,
    Seg,
    checkpoint,
    checkpoint_sequential,
    run_plan,
)
from ckptlab.recompute.plan import pytorch_sequential_plan

R = np.random.default_rng(3)
D = 6
W_DATA = [R.standard_normal((D, D)) / np.sqrt(D) for _ in range(4)]  # NumPy: no target yet
WEIGHTS: list = []  # the blocks' weight Tensors, made fresh for each test by `weights`


@pytest.fixture(autouse=True)
def weights(_target):
    """Weight Tensors made after conftest's `_target` pinned the test's target. Made at import
    they would live on whatever target was detected then: CuPy arrays on a GPU machine."""
    WEIGHTS[:] = [Tensor(w.copy(), requires_grad=True) for w in W_DATA]
    yield WEIGHTS
    WEIGHTS.clear()


def block(i):
    """A block with matmuls, a pointwise op and dropout: x + dropout(gelu(x W_i))."""
    return lambda x: x + layers.dropout(ops.gelu(ops.linear(x, WEIGHTS[i])), 0.3)


def run(fn, x0, seed=1):
    """Loss and gradients (weights and input) of fn on a fresh copy of x0."""
    for w in WEIGHTS:
        w.grad = None
    x = Tensor(x0.copy(), requires_grad=True)
    engine.manual_seed(seed)
    loss = (fn(x) * 0.5).sum()
    loss.backward()
    return [loss.data] + [w.grad.copy() for w in WEIGHTS] + [x.grad.copy()]


def chain(x):
    for i in range(4):
        x = block(i)(x)
    return x


X0 = R.standard_normal((3, D))


def bitwise_equal(a, b):
    return all(np.array_equal(u, v) for u, v in zip(a, b, strict=True))


def test_checkpoint_gives_bitwise_equal_gradients_with_dropout():
    plain = run(chain, X0)
    ckpt = run(lambda x: checkpoint(chain, x), X0)
    assert bitwise_equal(plain, ckpt)


def test_nested_checkpoints():
    def inner(x):
        return checkpoint(lambda t: block(1)(block(0)(t)), x)

    def outer(x):
        y = checkpoint(lambda t: block(2)(inner(t)), x)
        return checkpoint(block(3), y)

    assert bitwise_equal(run(chain, X0), run(outer, X0))


def test_broken_mode_redraws_masks_and_the_gradient_is_silently_wrong():
    plain = run(chain, X0)
    broken = run(lambda x: checkpoint(chain, x, preserve_rng_state=False), X0)
    assert np.array_equal(plain[0], broken[0])  # the loss is right: the forward was fine
    assert not np.array_equal(plain[1], broken[1])  # the gradients are not
    with pytest.raises(DeterminismError, match="preserve_rng_state=False"):
        run(lambda x: checkpoint(chain, x, preserve_rng_state=False,
                                 determinism_check="value"), X0)


def two_steps(fn, seed=9):
    """Two training steps in a row without reseeding, and the RNG state after them: a step
    that leaves the dropout offset elsewhere than the plain step does makes the second step
    draw other masks."""
    engine.manual_seed(seed)
    out = []
    for _ in range(2):
        for w in WEIGHTS:
            w.grad = None
        x = Tensor(X0.copy(), requires_grad=True)
        loss = (layers.dropout(fn(x), 0.5) * 0.5).sum()  # a dropout after the checkpoints
        loss.backward()
        out += [loss.data] + [w.grad.copy() for w in WEIGHTS] + [x.grad.copy()]
    return out, engine.rng_state()


def test_rng_state_after_a_checkpointed_step_equals_the_plain_one():
    """Two segments (the first is recomputed after the second has moved the offset on) and a
    dropout after them: a recompute that does not put the RNG state back leaves the offset
    at the end of segment 1, and the second step's masks and gradients differ."""
    plain, state = two_steps(chain)
    ckpt, ckpt_state = two_steps(
        lambda x: checkpoint(lambda t: block(3)(block(2)(t)),
                             checkpoint(lambda t: block(1)(block(0)(t)), x)))
    assert ckpt_state == state == (9, 10)  # 4 + 1 dropouts per step
    assert bitwise_equal(plain, ckpt)


def test_checkpoint_holds_only_its_input_until_backward():
    x = Tensor(X0.copy(), requires_grad=True, param=False)
    with ledger.record() as led:
        y = checkpoint(chain, x)
        assert led.bytes == x.data.nbytes and led.peak_checkpoints == 1
        y.sum().backward()
        assert led.bytes == 0
    with ledger.record() as plain:
        chain(x).sum().backward()
        plain_peak = plain.peak
    assert led.peak == plain_peak  # the recompute holds what the plain forward held
    assert led.flops["recompute"] == plain.flops["forward"] - x.size  # all but the final sum


def test_determinism_check_catches_a_changing_output_shape():
    calls = []

    def fickle(x):
        calls.append(1)
        return x * 2.0 if len(calls) == 1 else ops.sum(x, axis=0)

    y = checkpoint(fickle, Tensor(X0.copy(), requires_grad=True))
    with pytest.raises(DeterminismError, match=r"mul -> \(3, 6\).*sum -> \(6,\)"):
        y.sum().backward()


def test_checkpoint_under_no_grad_just_runs():
    with engine.no_grad():
        y = checkpoint(chain, Tensor(X0.copy(), requires_grad=True))
    assert y.node is None


def test_selective_checkpoint_replays_matmuls_and_matches_bitwise():
    plain = run(chain, X0)
    with ledger.record() as led:
        sel = run(lambda x: checkpoint(chain, x, policy="matmul"), X0)
    assert bitwise_equal(plain, sel)
    with ledger.record() as full:
        run(lambda x: checkpoint(chain, x), X0)
    linear_flops = 4 * 2 * 3 * D * D  # four x @ W: not recomputed
    assert full.flops["recompute"] - led.flops["recompute"] == linear_flops


def test_selective_holds_the_stored_outputs():
    x = Tensor(X0.copy(), requires_grad=True, param=False)
    with ledger.record() as led:
        checkpoint(chain, x, policy=["linear"])
        assert led.bytes == x.data.nbytes * 5  # the input and four (3, D) linear outputs


def test_checkpoint_inside_a_selective_recompute_is_refused():
    y = checkpoint(lambda t: checkpoint(chain, t), Tensor(X0.copy(), requires_grad=True),
                   policy="matmul")
    with pytest.raises(RuntimeError, match="selective"):
        y.sum().backward()


def test_policy_must_name_replayable_ops():
    with pytest.raises(ValueError, match="layernorm"):
        checkpoint(chain, Tensor(X0.copy()), policy=["layernorm"])


def test_checkpoint_argument_errors():
    with pytest.raises(ValueError, match="determinism_check"):
        checkpoint(chain, Tensor(X0.copy()), determinism_check="maybe")
    # no Tensor in what fn returns: returned as it is, as PyTorch's non-reentrant checkpoint
    # does (tests/test_checkpoint_ports.py)
    assert checkpoint(lambda x: (1, None), Tensor(X0.copy(), requires_grad=True)) == (1, None)
    x = Tensor(X0.copy(), requires_grad=True)
    assert checkpoint(lambda x: x.data, x) is x.data


# ------------------------------------------------------------------------------ sequential


def test_checkpoint_sequential_segments_and_plans_agree():
    blocks = [block(i) for i in range(4)]
    plain = run(chain, X0)
    for kwargs in ({"segments": 2}, {"segments": 4}, {"plan": schedules.make("sqrt", 4)},
                   {"plan": [Seg([0, Seg([1])]), 2, Seg([3], "matmul")]}):
        def fn(x, kwargs=kwargs):
            return checkpoint_sequential(blocks, x, **kwargs)

        assert bitwise_equal(plain, run(fn, X0))


def test_pytorchs_call_runs_pytorchs_plan():
    """checkpoint_sequential(blocks, segments, x), PyTorch's order: segments - 1 checkpointed
    chunks of L // segments blocks, the rest plain (worked by hand), each checkpointed block
    run twice and the others once, gradients bitwise those of no checkpointing."""
    assert pytorch_sequential_plan(8, 3) == [Seg([0, 1]), Seg([2, 3]), 4, 5, 6, 7]
    assert pytorch_sequential_plan(5, 1) == [0, 1, 2, 3, 4]
    assert pytorch_sequential_plan(4, 4) == [Seg([0]), Seg([1]), Seg([2]), 3]
    for bad in (0, 5, 2.0, True):
        with pytest.raises(ValueError, match=r"segments: expected an int in \[1, 4\]"):
            pytorch_sequential_plan(4, bad)
    plain = run(chain, X0)
    for segments, want in ((1, [1, 1, 1, 1]), (2, [2, 2, 1, 1]), (3, [2, 2, 1, 1]),
                           (4, [2, 2, 2, 1])):
        calls = [0] * 4

        def counted(i, calls=calls):
            def f(x):
                calls[i] += 1
                return block(i)(x)
            return f

        blocks = [counted(i) for i in range(4)]
        assert bitwise_equal(plain, run(lambda x, b=blocks, s=segments:
                                        checkpoint_sequential(b, s, x), X0))
        assert calls == want, (segments, calls)


def test_plans_must_cover_the_blocks_in_order():
    blocks = [block(i) for i in range(4)]
    with pytest.raises(ValueError, match="cover blocks 0..3"):
        checkpoint_sequential(blocks, Tensor(X0.copy()), plan=[Seg([0, 2]), 1, 3])
    with pytest.raises(ValueError, match="not both"):
        checkpoint_sequential(blocks, Tensor(X0.copy()), segments=2, plan=[0, 1, 2, 3])
    with pytest.raises(TypeError, match="schedules.make"):  # a spec is resolved by the caller
        checkpoint_sequential(blocks, Tensor(X0.copy()), plan="sqrt")
    with pytest.raises(TypeError, match="schedule"):  # not silently ignored
        checkpoint_sequential(blocks, Tensor(X0.copy()), schedule="sqrt")


def test_run_plan_nests_as_written():
    blocks = [block(i) for i in range(4)]
    x = Tensor(X0.copy(), requires_grad=True, param=False)
    with ledger.record() as led:
        y = run_plan(blocks, [Seg([Seg([0, 1]), Seg([2, 3])])], x)
        assert led.peak_checkpoints == 1  # the inner segments ran without grad
        y.sum().backward()
        assert led.peak_checkpoints == 2  # x and x_2 while [2, 3] was recomputed
