"""ckptlab schedules on torch modules (ckptlab.torch.schedule, profile, ledger, selective):
for a torch MLP and a small GPT (ckptlab flash attention, dropout on), every schedule's saved
bytes, measured through saved_tensors_hooks, equal ckptlab's prediction from the torch profile,
and its gradients are bitwise those of no checkpointing.

Selective schedules run on PyTorch's own selective checkpointing, which frees a cached op
output as soon as the recompute consumes it, where ckptlab's engine (and so its prediction)
keeps it to the end of the segment's backward: there the bytes at the end of the forward are
equal and the peak is at most the prediction."""

import pytest
from torch_oracle import torch  # skips this module without PyTorch

from ckptlab.recompute.plan import Seg
from ckptlab.torch import TorchLedger, checkpoint_sequential, context_fn, nets, profile
from ckptlab.torch.schedule import make_schedule

SPECS = ["none", "sqrt", "every(2)", "revolve(2)", "revolve(3)", "chen_greedy(30%)",
         "optimal(40%)", "optimal(60%)", "recompute(attn)"]


def model(kind):
    g = torch.Generator().manual_seed(3)
    if kind == "mlp":
        m = nets.MLP(width=8, layers=6, dropout=0.2, seed=1)
        return m, torch.randn(5, 8, generator=g), torch.randint(0, 8, (5,), generator=g)
    m = nets.GPT(vocab=13, ctx=17, width=32, heads=2, layers=4, dropout=0.1, attn="flash",
                 seed=1)
    return m, torch.randint(0, 13, (2, 17), generator=g), torch.randint(0, 13, (2, 17),
                                                                         generator=g)


def step(m, x, y, sched=None, prof=None):
    """One training step under a ledger: (peak, bytes held after the forward, gradients)."""
    m.zero_grad(set_to_none=True)
    torch.manual_seed(7)  # the dropout masks (nn.Dropout, and the attention's Philox seeds)
    led = TorchLedger(m.parameters())
    with led:
        loss = m(x, y, schedule=sched, profile=prof)
        held = led.bytes
        loss.backward()
    assert led.bytes == 0, "the ledger must end empty: every saved tensor released"
    return led.peak, held, {n: p.grad.clone() for n, p in m.named_parameters()}


@pytest.fixture(scope="module", params=["mlp", "gpt"])
def setup(request):
    m, x, y = model(request.param)
    torch.manual_seed(7)
    prof = m.profile(x, y, policies=["matmul"], recompute=[{"attention"}])
    return m, x, y, prof, step(m, x, y)[2]


def forward_end(pred):
    """Predicted bytes held when the forward is done: after the last "F"/"f" step."""
    last = max(i for i, (a, _, _) in enumerate(pred.steps) if a in ("F", "f"))
    return pred.steps[last][2]


@pytest.mark.parametrize("spec", SPECS)
def test_measured_bytes_equal_the_prediction_and_gradients_are_bitwise(setup, spec):
    m, x, y, prof, plain = setup
    sched = make_schedule(spec, len(m.blocks), prof)
    pred = sched.predict(prof)
    peak, held, grads = step(m, x, y, sched, prof)
    assert (peak, held) == (pred.peak_bytes, forward_end(pred)), sched.plan
    assert all(torch.equal(grads[n], plain[n]) for n in plain), sched.plan


def test_selective_holds_the_prediction_at_the_forward_and_at_most_it_after(setup):
    m, x, y, prof, plain = setup
    sched = make_schedule("selective(matmul)", len(m.blocks), prof)
    pred = sched.predict(prof)
    peak, held, grads = step(m, x, y, sched, prof)
    assert held == forward_end(pred) and peak <= pred.peak_bytes
    assert peak < make_schedule("none", len(m.blocks)).predict(prof).peak_bytes + 1
    assert all(torch.equal(grads[n], plain[n]) for n in plain)


def test_recompute_attn_drops_exactly_p_with_naive_attention():
    """Korthikanti's selective recompute on a naive-attention GPT: the attention core keeps
    q, k, v (the projections' outputs, the same bytes as the copies the kernel would keep) and
    not P, so after the forward each block holds B H N N fp32 fewer bytes."""
    g = torch.Generator().manual_seed(0)
    L, B, N, H = 3, 2, 24, 2
    m = nets.GPT(vocab=11, ctx=N, width=32, heads=H, layers=L, attn="naive", seed=2)
    x, y = (torch.randint(0, 11, (B, N), generator=g) for _ in range(2))
    prof = m.profile(x, y, recompute=[{"attention"}])
    _, held_none, plain = step(m, x, y)
    sched = make_schedule("recompute(attn)", L, prof)
    peak, held, grads = step(m, x, y, sched, prof)
    assert held_none - held == L * B * H * N * N * 4
    assert peak == sched.predict(prof).peak_bytes
    assert all(torch.equal(grads[n], plain[n]) for n in plain)


def test_the_profile_counts_what_autograd_saves():
    """An MLP block, by hand: addmm saves its input x (B, D) (the weights are parameters),
    relu its output (B, 4D), which the second addmm saves too; dropout on the CPU multiplies
    by a float noise tensor (B, D) (1/(1-p) or 0), which the multiplication saves."""
    m, x, y = model("mlp")
    prof = profile(list(m.blocks), x.requires_grad_(True))
    B, D = x.shape
    first = prof.stages[0]
    assert sorted(first.saved.values()) == sorted([4 * B * D, 4 * B * 4 * D, 4 * B * D])
    assert first.saved["in"] == 4 * B * D and first.in_bytes == first.out_bytes == 4 * B * D
    assert first.fwd_flops == 2 * 2 * B * D * 4 * D  # two matmuls (FlopCounterMode)
    assert first.bwd_flops == 2 * first.fwd_flops  # dX and dW of each (x wants a gradient)


def test_attention_flops_and_a_budget_plan_the_gpt():
    m, x, y = model("gpt")
    prof = m.profile(x, y)
    B, N = x.shape
    block = prof.stages[1]
    attn = 2 * 2 * B * N * N * 32  # Q K^T and P V over all heads: 2 B H N N d each
    assert block.bwd_recompute_flops == attn // 2  # flash redoes S = Q K^T
    assert block.fwd_flops > attn
    sched = make_schedule("optimal(40%)", len(m.blocks), prof)
    none = make_schedule("none", len(m.blocks)).predict(prof).peak_bytes
    assert sched.predict(prof).peak_bytes <= 0.4 * none < none


def test_checkpoint_sequential_on_plain_modules():
    """A budgeted spec on a list of modules profiles the chain by itself; the output and the
    input's gradient are those of running the modules plainly."""
    torch.manual_seed(0)
    mods = [torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh()) for _ in range(5)]
    x = torch.randn(3, 16, requires_grad=True)
    y = checkpoint_sequential(mods, x, schedule="optimal(70%)")
    y.sum().backward()
    gx, x.grad = x.grad, None
    z = x
    for mod in mods:
        z = mod(z)
    z.sum().backward()
    assert torch.equal(y, z) and torch.equal(gx, x.grad)
    y = checkpoint_sequential(mods, x, schedule=[Seg([Seg([0]), 1]), 2, Seg([3, 4])])
    assert torch.equal(y, z)


def test_the_exported_policy_is_pytorchs_selective_checkpointing():
    """context_fn("matmul") keeps exactly the mm/addmm outputs: what the profile predicts."""
    m, x, y = model("mlp")
    block, t = m.blocks[0], x.requires_grad_(True)
    stored = profile([block], t, policies=["matmul"]).stages[0].stored
    led = TorchLedger(block.parameters())
    with led:
        out = torch.utils.checkpoint.checkpoint(block, t, use_reentrant=False,
                                                context_fn=context_fn("matmul"))
    assert led.bytes == t.untyped_storage().nbytes()  # autograd itself holds only the input
    (want,) = stored.values()
    assert sum(want.values()) == 4 * x.shape[0] * (4 + 1) * x.shape[1]  # (B, 4D) and (B, D)
    out.sum().backward()
    assert t.grad is not None


@pytest.mark.parametrize("bad,message", [
    ("optimal(40%)", "needs a profile"),
    ([0, 2, 1, 3], "cover blocks"),
    (3, "spec string"),
])
def test_bad_schedules(bad, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make_schedule(bad, 4)
