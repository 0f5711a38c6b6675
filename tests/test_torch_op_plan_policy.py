"""ckptlab.torch.op_plan's selective policy asked directly, as a PyTorch that consults it in the
recompute too would ask it (PyTorch before 2.13; 2.13 asks in the forward only and replays its
cache, so tests/test_torch_op_plan.py's measured runs cannot tell one counter from two): the
forward's k-th call of an op and the recompute's k-th call get the same answer."""

import pytest

torch = pytest.importorskip("torch")
from torch.utils.checkpoint import CheckpointPolicy  # noqa: E402

from ckptlab.torch import op_plan  # noqa: E402


class Ctx:
    def __init__(self, is_recompute):
        self.is_recompute = is_recompute


def test_forward_and_recompute_count_calls_apart():
    """keep = {second mm, first addmm}. Forward: mm, addmm, mm, addmm -> calls mm#0, addmm#0,
    mm#1, addmm#1 -> recompute, save, save, recompute. The recompute then makes the same four
    calls and must get the same four answers; one shared counter would number them mm#2,
    addmm#2, mm#3, addmm#3 and save nothing."""
    mm, addmm = torch.ops.aten.mm.default, torch.ops.aten.addmm.default
    policy = op_plan._policy(frozenset({("aten.mm", 1), ("aten.addmm", 0)}))
    save, redo = CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE
    want = [redo, save, save, redo]
    for is_recompute in (False, True):
        got = [policy(Ctx(is_recompute), op) for op in (mm, addmm, mm, addmm)]
        assert got == want, "recompute" if is_recompute else "forward"
