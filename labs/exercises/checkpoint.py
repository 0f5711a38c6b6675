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
    #     Keep the RNG state first (tape.rng_state): dropout inside fn draws from it, and the
    #     recompute in step 2 must draw the same masks. Then run fn(x) with grad off (the
    #     context manager tape.no_grad): no op inside fn builds a node, so nothing inside is
    #     saved; only the node returned below holds x. Defines: rng (the state), y (fn's
    #     output).
    raise NotImplementedError("checkpoint: step 1 is not written yet")
    # <<< end of step 1

    def backward(g):
        # >>> YOUR CODE, step 2 of 2: fn again on a copy of x, with grad; g through it; x's gradient
        #     The node's backward(g): fn again, this time building a graph, and g through it.
        #     Names to use, in the order they are needed: tape.set_rng_state (draw with the
        #     state kept in step 1; take the current one with tape.rng_state first and put it
        #     back after, so that the rest of the backward is not disturbed); x.detach (a copy
        #     of x that requires grad and is a leaf of its own, so the local graph ends there
        #     and not in the graph behind x); tape.enable_grad (a context manager: the backward
        #     runs with grad off, and the recompute must build its ops' nodes); tape.phase (the
        #     engine counts FLOPs by phase, and its own checkpoint runs the recompute under the
        #     phase named "recompute": ckptlab/recompute/ledger.py); backward on the recomputed
        #     output, with g (the parameters fn reads get their gradients on that pass); and
        #     x.node.add_grad, which adds to what x may already have from its other consumers. x
        #     may need no gradient at all (a first segment, whose input is data): then x has no
        #     node and gets nothing, while fn's parameters still get theirs.
        raise NotImplementedError("checkpoint: step 2 is not written yet")
        # <<< end of step 2

    # the one node: it holds x (saved) until its backward, which is the recompute above
    return make(y.data, "checkpoint", (x,), backward, saved=(x,), force=True, kind="checkpoint")
