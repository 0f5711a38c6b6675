"""ckptlab.torch.op_plan: the op-level plan (which op outputs each block and the head keep,
run as PyTorch selective checkpointing) holds exactly the bytes it predicts at the end of the
forward and replays exactly the FLOPs it predicts (TorchLedger; FlopCounterMode), for budgets
from everything to nearly nothing, on odd and even shapes; the loss and gradients equal the
plain model's; a budget below the least is one clear error. Against torch.compile's
activation_memory_budget (slow: a compile per budget): never more saved bytes than torch at
its budget, and never more recompute FLOPs."""

import pytest

torch = pytest.importorskip("torch")

from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from ckptlab.torch import nets, op_plan  # noqa: E402
from ckptlab.torch.ledger import TorchLedger  # noqa: E402


def setup(B, N, C, H, L, V, seed=0):
    torch.manual_seed(seed)
    model = nets.GPT(vocab=V, ctx=N, width=C, heads=H, layers=L, attn="math", seed=seed)
    x, y = torch.randint(0, V, (B, N)), torch.randint(0, V, (B, N))
    prof = op_plan.profile_blocks(op_plan.stages(model, y), x)
    return model, x, y, prof


def measure(model, x, y, choice):
    """(saved bytes at the end of the forward, their peak, backward FLOPs, loss, gradients);
    the FLOPs in a step of their own (FlopCounterMode keeps a replay's tensors alive)."""
    led = TorchLedger(model.parameters())
    with led:
        loss = op_plan.run(model, x, y, choice)
        end = led.bytes
        loss.backward()
    model.zero_grad(set_to_none=True)
    loss = op_plan.run(model, x, y, choice)
    with FlopCounterMode(display=False) as fc:
        loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return end, led.peak, fc.get_total_flops(), loss.detach(), grads


@pytest.mark.parametrize("shape", [(2, 16, 32, 2, 2, 32),
                                   pytest.param((3, 9, 32, 4, 3, 41), marks=pytest.mark.slow)])
def test_predicted_bytes_and_replay_are_measured(shape):
    model, x, y, prof = setup(*shape)
    n = len(prof)
    end0, _, flops0, loss0, grads0 = measure(model, x, y, ["plain"] * n)
    fixed = end0 - sum(p.plain for p in prof)
    least = op_plan.plan(prof, 10**12)[1]
    for frac in (1.0, 0.5, 0.25):
        budget = int(frac * end0) - fixed
        try:
            choice, held, replay = op_plan.plan(prof, budget)
        except ValueError as e:
            assert "below the least" in str(e)
            continue
        assert held <= budget
        end, peak, flops, loss, grads = measure(model, x, y, choice)
        assert end == held + fixed
        assert peak <= end + max(p.plain for p in prof)  # a replay: one stage at a time
        assert flops - flops0 == replay
        assert torch.equal(loss, loss0)
        assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(grads, grads0,
                                                                              strict=True))
    assert least < end0 - fixed  # keeping every matmul output holds less than plain
    with pytest.raises(ValueError, match="below the least the blocks can hold"):
        op_plan.plan(prof, prof[0].in_bytes)


@pytest.mark.slow
def test_against_torch_compile_budget():
    import torch._functorch.config as fcfg
    model, x, y, prof = setup(4, 32, 32, 2, 3, 32)
    n = len(prof)
    end0, _, flops0, _, _ = measure(model, x, y, ["plain"] * n)
    fixed = end0 - sum(p.plain for p in prof)
    old = fcfg.activation_memory_budget
    try:
        for budget in (0.3, 0.6):
            torch._dynamo.reset()
            fcfg.activation_memory_budget = budget
            cm = torch.compile(model, backend="aot_eager_decomp_partition")
            cm(x, y).backward()
            led = TorchLedger(model.parameters())
            with led:
                loss = cm(x, y)
                saved = led.bytes
                with FlopCounterMode(display=False) as fc:
                    loss.backward()
            model.zero_grad(set_to_none=True)
            theirs = fc.get_total_flops() - flops0
            choice, held, replay = op_plan.plan(prof, saved - fixed)
            assert held + fixed <= saved
            assert replay <= theirs
    finally:
        fcfg.activation_memory_budget = old
        torch._dynamo.reset()


def test_a_plan_that_keeps_some_outputs_inside_a_checkpointed_block():
    """A budget between "keep nothing" and "plain" where some block is checkpointed keeping
    part of its matmul outputs: the selective policy must tell the forward's k-th call of an
    op from the recompute's (two counters), or the kept outputs are the wrong ones and the
    bytes or the replayed FLOPs are off."""
    model, x, y, prof = setup(2, 16, 32, 2, 2, 32)
    end0, _, flops0, loss0, _ = measure(model, x, y, ["plain"] * len(prof))
    fixed = end0 - sum(p.plain for p in prof)
    partial = None
    least = sum(p.frontier[0][0] for p in prof)  # every block keeping the least it can
    for budget in range(least, end0 - fixed, 2048):
        choice, held, replay = op_plan.plan(prof, budget)
        if any(c != "plain" and 0 < len(c) < len(p.items) for c, p in zip(choice, prof,
                                                                           strict=True)):
            partial = choice, held, replay
            break
    assert partial is not None, "no budget keeps part of a block's outputs"
    choice, held, replay = partial
    end, _, flops, loss, _ = measure(model, x, y, choice)
    assert end == held + fixed
    assert flops - flops0 == replay > 0
    assert torch.equal(loss, loss0)


def test_a_time_cost_counts_what_flops_leave_out():
    """TimeModel by hand: launch + max(FLOPs / rate, bytes / bandwidth). Under cost="time" a
    checkpointed block keeping every matmul output still costs its LayerNorms, softmax, GeLU
    and adds (0 FLOPs, more than 0 seconds); each plan holds what it predicts."""
    tm = op_plan.TimeModel(launch_s=1e-6, flops_per_s=1e9, bytes_per_s=1e8)
    assert tm.seconds(2000, 100) == pytest.approx(3e-6)
    assert tm.seconds(0, 1000) == pytest.approx(1.1e-5)
    model, x, y, _ = setup(2, 16, 32, 2, 2, 32)
    prof = op_plan.profile_blocks(op_plan.stages(model, y), x, time_model=tm)
    for p in prof:
        keep_all = [pt for pt in p.frontier_time if pt[2] != "plain" and
                    len(pt[2]) == len(p.items)]
        assert keep_all and keep_all[0][1] == pytest.approx(p.seconds - sum(p.item_seconds))
        assert keep_all[0][1] > 0  # the FLOP frontier gives the same choice 0
    end0, _, flops0, loss0, _ = measure(model, x, y, ["plain"] * len(prof))
    fixed = end0 - sum(p.plain for p in prof)
    for frac in (0.9, 0.5):
        budget = int(frac * (end0 - fixed))
        for cost in op_plan.COSTS:
            choice, held, replay = op_plan.plan(prof, budget, cost)
            end, _, flops, loss, _ = measure(model, x, y, choice)
            assert end == held + fixed <= budget + fixed
            assert torch.equal(loss, loss0)
            if cost == "flops":
                assert flops - flops0 == replay
    assert op_plan.plan(prof, 10**12, "time")[2] == 0  # everything plain
    with pytest.raises(ValueError, match="needs blocks profiled with a TimeModel"):
        op_plan.plan(setup(2, 16, 32, 2, 1, 32)[3], 10**12, "time")
    with pytest.raises(ValueError, match="cost: expected one of"):
        op_plan.plan(prof, 10**12, "watts")
