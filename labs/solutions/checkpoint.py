"""Exercise checkpoint (lab 09): checkpoint() written by hand, micrograd's way.

checkpoint(fn, x) returns fn(x) but holds only x for the backward: the forward runs under
no_grad, so nothing inside fn is saved and no graph is built there; the graph gets one node,
and that node's backward runs fn again, with grad on, on a copy of x, back-propagates the
incoming gradient through the fresh local graph, and hands x its gradient. The RNG state is
kept, so that a dropout inside fn draws the same masks the second time (lab 06), and put
back after, so that the next draw is a new one; the recompute is counted as recompute (the
ledger's phase), so the hardware FLOPs include it and the model FLOPs do not. x may need no
gradient (a first segment: the model's input): then only fn's parameters get one.

Check: python -m ckptlab exercise check checkpoint   (--hint 2: a second hint)
The engine's own, with every option PyTorch's has: ckptlab/recompute/checkpoint.py.
"""

from ckptlab.engine import tape
from ckptlab.engine.tensor import Tensor, make


def checkpoint(fn, x: Tensor) -> Tensor:
    """y = fn(x), holding only x until the backward, where fn runs again."""
    # >>> checkpoint 1: the RNG state, then fn(x) with nothing saved
    rng = tape.rng_state()  # what dropout draws from: the recompute must draw the same masks
    with tape.no_grad():  # no op inside fn builds a node, so none saves anything
        y = fn(x)
    # <<< checkpoint 1

    def backward(g):
        # >>> checkpoint 2: fn again on a copy of x, with grad; g through it; x's gradient
        now = tape.rng_state()
        tape.set_rng_state(rng)
        local = x.detach(requires_grad=True)  # a leaf: the local graph ends here, not in x's
        with tape.enable_grad(), tape.phase("recompute"):  # its FLOPs: recompute, not model
            y2 = fn(local)
        tape.set_rng_state(now)
        y2.backward(g)  # the parameters fn reads get their gradients here too
        # x has no node when it needs no gradient (a first segment's input): nothing to add
        if x.node is not None:
            x.node.add_grad(local.grad)  # adds: x may have other consumers
        # <<< checkpoint 2

    # the one node: it holds x (saved) until its backward, which is the recompute above
    return make(y.data, "checkpoint", (x,), backward, saved=(x,), force=True, kind="checkpoint")
