"""Bytes of PyTorch's saved tensors over time, counted by storage like ckptlab's ledger.

    led = TorchLedger(model.parameters())
    with led:                       # pushes saved_tensors_hooks(led.pack, led.unpack)
        loss = model(x); loss.backward()
    led.peak                        # bytes: the most held for the backward at any moment

A tensor autograd saves is *acquired* when packed and *released* when autograd drops it (the
packed handle dies). Tensors are counted by the storage that owns their memory, so views and
two ops saving one activation count it once; parameters (and views of them) never count.

Two holders the pack hook alone cannot see, both from torch.utils.checkpoint(use_reentrant=
False), are watched too, so the ledger measures what a checkpointed step really holds:
  - a recompute saves into the checkpoint's own hook, below any outer hook: recompute_hooks(),
    entered as a checkpoint's recompute context (context_fn), chains a counting pack in front
    of it, and each recomputed tensor is released when the checkpoint hands it over;
  - a selective checkpoint's cache (create_selective_checkpoint_contexts) keeps op outputs
    outside autograd: hold_cached() counts each until the recompute consumes it.
"""

from __future__ import annotations

import contextlib
import weakref

import torch
from torch.utils._pytree import tree_leaves

_stack: list = []  # ledgers entered with `with`, innermost last


def current():
    """The innermost ledger entered with `with`, or None."""
    return _stack[-1] if _stack else None


def storage_of(t: torch.Tensor):
    """(key, bytes) of the storage that owns t's memory."""
    st = t.untyped_storage()
    return st.data_ptr(), st.nbytes()


class _Handle:
    """What the pack hook hands autograd: the tensor, and a life the ledger watches."""

    __slots__ = ("t", "__weakref__")

    def __init__(self, t):
        self.t = t


class TorchLedger:
    """Saved-tensor bytes alive now (`bytes`), their peak, and per storage a label (with
    labels=True: "in"/"out" where named, else the order in which storages were first saved)."""

    def __init__(self, params=(), labels: bool = False, timeline: bool = False):
        self.bytes, self.peak = 0, 0
        self._held = {}  # storage key -> [bytes, holders]
        self._params = {storage_of(p)[0] for p in params}
        self.label_of = {} if labels else None
        self.events = [] if timeline else None  # bytes after every acquire/release

    # ---------------------------------------------------------------------------- counting
    def acquire(self, t: torch.Tensor, holder) -> None:
        """Count t's storage as held while `holder` lives (a parameter's never)."""
        key, nbytes = storage_of(t)
        if key in self._params or nbytes == 0:
            return
        entry = self._held.get(key)
        if entry is None:
            entry = self._held[key] = [nbytes, 0]
            self.bytes += nbytes
            self.peak = max(self.peak, self.bytes)
            if self.label_of is not None and key not in self.label_of:
                self.label_of[key] = str(len(self.label_of))
        entry[1] += 1
        weakref.finalize(holder, self._release, key)
        if self.events is not None:
            self.events.append(self.bytes)

    def _release(self, key) -> None:
        entry = self._held[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.bytes -= entry[0]
            del self._held[key]
            if self.events is not None:
                self.events.append(self.bytes)

    def pack(self, t):
        handle = _Handle(t)
        self.acquire(t, handle)
        return handle

    @staticmethod
    def unpack(h):
        return h.t if isinstance(h, _Handle) else h

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
        self._hooks.__enter__()
        _stack.append(self)
        return self

    def __exit__(self, *exc):
        _stack.pop()
        self._hooks.__exit__(*exc)

    @contextlib.contextmanager
    def as_current(self):
        """This ledger as current() (no hooks pushed): for code run in a backward."""
        _stack.append(self)
        try:
            yield self
        finally:
            _stack.pop()

    # ---------------------------------------------------------------------------- checkpoint
    @contextlib.contextmanager
    def recompute_hooks(self):
        """Inside a checkpoint's recompute (its context_fn's second context): count what the
        recompute saves, then hand it to the checkpoint's own hook unchanged. Each tensor is
        passed on as a fresh alias (x.detach(), the same storage), whose life is exactly that
        of the checkpoint's reference to it."""
        top = torch._C._autograd._top_saved_tensors_default_hooks(True)
        if top is None:
            raise RuntimeError("recompute_hooks: no saved-tensor hook to chain to; enter it "
                               "only as torch.utils.checkpoint's recompute context")
        pack, unpack = top

        def counted(x):
            alias = x.detach()
            self.acquire(alias, alias)
            return pack(alias)

        with torch.autograd.graph.saved_tensors_hooks(counted, unpack):
            yield

    def hold_cached(self, cache: dict) -> None:
        """Count the op outputs a selective checkpoint cached (its caching mode's storage:
        {op: {call index: wrapped output}}) until the recompute consumes each one."""
        for calls in cache.values():
            for entry in calls.values():
                for wrapper in tree_leaves(entry):
                    if isinstance(getattr(wrapper, "val", None), torch.Tensor):
                        self.acquire(wrapper.val, wrapper)

    # ---------------------------------------------------------------------------- labels
    def name(self, t: torch.Tensor, label: str) -> None:
        """Label t's storage (labels=True), replacing any label it had."""
        self.label_of[storage_of(t)[0]] = label

    def label(self, t: torch.Tensor):
        return self.label_of.get(storage_of(t)[0])

    def held_by_label(self) -> dict:
        """{label: bytes} of the storages held now (labels=True)."""
        return {self.label_of.get(k, f"?{k}"): e[0] for k, e in self._held.items()}
