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
    # >>> YOUR CODE, step 1 of 2: the RNG state, then fn(x) with nothing saved
    #     Keep the RNG state (tape.rng_state()), then run fn(x) under tape.no_grad():
    #     nothing inside fn builds a node, so nothing is saved. Defines: rng, y.
    raise NotImplementedError("checkpoint: step 1 is not written yet")
    # <<< end of step 1

    def backward(g):
        # >>> YOUR CODE, step 2 of 2: fn again on a copy of x, with grad; g through it; x's gradient
        #     In the node's backward(g): restore the RNG state kept in step 1 (and put back the
        #     current one after), run fn with grad on (tape.enable_grad()) on a copy of x that is a
        #     leaf of its own (x.detach(requires_grad=True)), back-propagate g through that output
        #     (y2.backward(g)), and add the copy's gradient to x's (x.node.add_grad(...)): x may
        #     have other consumers.
        raise NotImplementedError("checkpoint: step 2 is not written yet")
        # <<< end of step 2

    # the one node: it holds x (saved) until its backward, which is the recompute above
    return make(y.data, "checkpoint", (x,), backward, saved=(x,), force=True, kind="checkpoint")
