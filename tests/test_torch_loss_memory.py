"""What PyTorch's cross-entropy holds, measured: every tensor an op creates during the backward
is tracked (TorchDispatchMode, its storage's bytes until the tensor is freed), and the most
alive at once beside the saved log-softmax is what ckptlab.cluster.step_memory.loss_bytes
counts for loss="torch": two fp32 logits-sized buffers (nll_loss_backward's and
_log_softmax_backward_data's)."""

import weakref

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from ckptlab.cluster import step_memory as sm  # noqa: E402


class NewStorage(TorchDispatchMode):
    """Bytes of storages created inside the mode and still alive; their peak."""

    def __init__(self):
        super().__init__()
        self.live, self.now, self.peak = {}, 0, 0

    def _free(self, key):
        self.now -= self.live.pop(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            key = t.untyped_storage().data_ptr()
            if key and key not in inputs and key not in self.live:  # a new buffer, not a view
                self.live[key] = t.untyped_storage().nbytes()
                self.now += self.live[key]
                weakref.finalize(t, self._free, key)
                self.peak = max(self.peak, self.now)
        return out


@pytest.mark.parametrize("rows,V", [(12, 16), (64, 1000)])
def test_cross_entropy_backward_holds_two_logits_buffers(rows, V):
    torch.manual_seed(0)
    logits = torch.randn(rows, V, requires_grad=True)
    loss = torch.nn.functional.cross_entropy(logits, torch.randint(0, V, (rows,)))
    mode = NewStorage()
    with mode:
        loss.backward()
    saved, transient = sm.loss_bytes("torch", rows, 1, V, 1, 4)
    assert mode.peak - 4 == transient == 2 * 4 * rows * V  # 4: the backward's scalar seed
    assert saved == 4 * rows * V + 8 * rows + 4  # the log-softmax, targets and total weight
