"""What a user of the PyTorch bridge can get wrong, each with an error that names it (or the
right answer): a varlen batch whose every key sequence is empty still backpropagates (zero
gradients); unpad_input with a 1-D tensor or a NumPy array; checkpoint_sequential with a
segments that is not an int; a double backward through the attention function; sparse,
nested and meta tensors."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: pip install -e "
                            "'.[torch]'")

from ckptlab import emu  # noqa: E402
from ckptlab import torch as ct  # noqa: E402
from ckptlab.torch import bert_padding  # noqa: E402


def offsets(lengths):
    return torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32)


@pytest.mark.parametrize("lens_q", [[3, 5], [0, 4], [0, 0]])
def test_varlen_with_every_key_sequence_empty_gives_zero_gradients(lens_q):
    g = torch.Generator().manual_seed(sum(lens_q))
    q = torch.randn(sum(lens_q), 2, 16, generator=g, requires_grad=True)
    k = torch.randn(0, 1, 16, requires_grad=True)
    v = torch.randn(0, 1, 16, requires_grad=True)
    out, lse, _ = ct.flash_attn_varlen_func(q, k, v, offsets(lens_q), offsets([0, 0]),
                                            max(lens_q), 0, return_attn_probs=True)
    assert out.shape == q.shape and not out.any()
    assert lse.shape == (2, sum(lens_q)) and bool((lse == float("inf")).all())
    (out * torch.randn(out.shape, generator=g)).sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and t.grad.shape == t.shape and not t.grad.any()


def test_varlen_mixed_empty_and_full_keys_still_match_one_sequence():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(9, 2, 16, generator=g, requires_grad=True)
    k, v = (torch.randn(7, 2, 16, generator=g, requires_grad=True) for _ in range(2))
    with emu.settings(mode="fast"):
        out = ct.flash_attn_varlen_func(q, k, v, offsets([4, 5]), offsets([0, 7]), 5, 7)
        out.sum().backward()
        q2, k2, v2 = (t.detach()[None].requires_grad_(True) for t in (q[4:], k, v))
        want = ct.flash_attn_func(q2, k2, v2)
        want.sum().backward()
    assert not out[:4].any() and torch.equal(out[4:], want[0])
    assert not q.grad[:4].any() and torch.equal(q.grad[4:], q2.grad[0])
    assert torch.equal(k.grad, k2.grad[0]) and torch.equal(v.grad, v2.grad[0])


@pytest.mark.parametrize("hidden,mask,error,message", [
    (lambda: torch.randn(5), lambda: torch.ones(5, dtype=torch.bool), ValueError,
     r"hidden_states must have shape \(batch, seqlen, \.\.\.\), rank >= 2, got \(5,\)"),
    (lambda: torch.randn(2, 3, 4), lambda: np.ones((2, 3), bool), TypeError,
     "attention_mask must be a torch.Tensor, got numpy.ndarray"),
    (lambda: np.ones((2, 3, 4)), lambda: torch.ones(2, 3, dtype=torch.bool), TypeError,
     "hidden_states must be a torch.Tensor, got numpy.ndarray"),
])
def test_unpad_input_names_what_is_wrong(hidden, mask, error, message):
    with pytest.raises(error, match=message):
        bert_padding.unpad_input(hidden(), mask())


def test_unpad_input_takes_rank_2_hidden_states():
    x = torch.arange(6.0).reshape(2, 3)
    mask = torch.tensor([[1, 0, 1], [1, 1, 0]])
    tokens, indices, cu, max_len, used = bert_padding.unpad_input(x, mask)
    assert tokens.tolist() == [0.0, 2.0, 3.0, 4.0] and cu.tolist() == [0, 2, 4]
    assert torch.equal(bert_padding.pad_input(tokens, indices, 2, 3), x * mask)


@pytest.mark.parametrize("segments", [2.5, "3", True, None])
def test_checkpoint_sequential_names_a_segments_that_is_not_an_int(segments):
    blocks = [torch.nn.Linear(4, 4) for _ in range(4)]
    x = torch.randn(2, 4, requires_grad=True)
    with pytest.raises(TypeError, match=f"segments must be an int .*got {type(segments).__name__}"):
        ct.checkpoint_sequential(blocks, segments, x, use_reentrant=False)


@pytest.mark.parametrize("call", ["attention", "apply", "flash_attn_func"])
def test_double_backward_says_the_backward_is_once_differentiable(call):
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 9, 16, generator=g, requires_grad=True) for _ in range(3))
    with emu.settings(mode="fast"):
        if call == "attention":
            out = ct.attention(q, k, v, causal=True)
        elif call == "apply":
            out = ct.FlashAttention.apply(q, k, v, True)
        else:
            out = ct.flash_attn_func(q, k, v, causal=True)
        dq, dk = torch.autograd.grad(out.sum(), (q, k), create_graph=True)
        with pytest.raises(RuntimeError, match="not differentiable .*once_differentiable.*"
                                               "double backward"):
            (dq.square().sum() + dk.sum()).backward()
        # without create_graph the gradients are plain tensors, equal to those above
        out = ct.attention(q, k, v, causal=True) if call == "attention" else out
        if call == "attention":
            dq2, = torch.autograd.grad(out.sum(), q)
            assert not dq2.requires_grad and torch.equal(dq2, dq.detach())


LAYOUTS = [
    ("sparse", lambda t: t.to_sparse(), TypeError, "must be a dense tensor .*sparse_coo"),
    ("nested", lambda t: torch.nested.nested_tensor(list(t.unbind(0)), layout=torch.jagged),
     TypeError, "is a nested tensor"),
    ("meta", lambda t: t.to("meta"), ValueError, "is a meta tensor"),
]


@pytest.mark.parametrize("kind,make,error,message", LAYOUTS, ids=[c[0] for c in LAYOUTS])
@pytest.mark.parametrize("call", ["attention", "apply", "flash_attn_func", "varlen"])
@pytest.mark.parametrize("which", [0, 1])
def test_sparse_nested_and_meta_tensors_are_named(kind, make, error, message, call, which):
    shape = (3, 8, 16) if call == "varlen" else (2, 3, 8, 16)
    t = [torch.randn(shape) for _ in range(3)]
    t[which] = make(t[which])
    with pytest.raises(error, match=f"^{'qk'[which]} {message}"):
        if call == "attention":
            ct.attention(*t)
        elif call == "apply":
            ct.FlashAttention.apply(*t)
        elif call == "flash_attn_func":
            ct.flash_attn_func(*t)
        else:
            ct.flash_attn_varlen_func(*t, offsets([3]), offsets([3]), 3, 3)


class _TupleBlock(torch.nn.Module):
    """A block returning (y, 2y), taking such a pair or a tensor."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        x = x[0] if isinstance(x, tuple) else x
        y = self.lin(x).tanh()
        return y, 2 * y


def test_a_budgeted_schedule_on_blocks_returning_tuples_names_the_stage():
    """optimal(...) profiles each block's output as one tensor: a tuple is a TypeError naming
    the block (it was an AttributeError from inside the profiler); sqrt needs no profile and
    runs the same chain."""
    blocks = [_TupleBlock() for _ in range(4)]
    x = torch.randn(2, 4, requires_grad=True)
    with pytest.raises(TypeError, match="profile: stage 0 returned a tuple; a profile measures"):
        ct.checkpoint_sequential(blocks, x, "optimal(40%)")
    with pytest.raises(TypeError, match="stage 0 returned a tuple"):
        ct.profile(blocks, x)
    y, _ = ct.checkpoint_sequential(blocks, x, "sqrt")
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
