"""What the checkpoint() check keeps out of the learner's reach.

The engine's state (grad mode, the phase FLOPs are counted under, the dropout RNG, the ledger,
...) is one per process, and a learner's checkpoint() can leave it changed: each run of the
check (the engine's and the learner's) starts from the state a fresh process has, and the
caller's state is put back when the check ends, so a careless cell before the check cannot
change its verdict and the check cannot change the cells after it.

The engine's functions are module attributes, and the learner's file runs in the same
process: it could replace the check's reference (ckptlab.recompute.checkpoint.checkpoint) or a
tape function the comparison reads. `Guard` records every attribute of the modules the check
depends on (and of their classes) and names, then undoes, any that a learner's code replaced.
"""

from __future__ import annotations

import contextlib
import importlib

from ckptlab.engine import tape

# the engine state the check resets: tape._State's attributes, whose class values are a fresh
# process's state
STATE = ("grad_enabled", "phase", "seed", "offset", "ledger", "store", "recompute_ops", "trace")
_FRESH = {k: getattr(tape._State, k) for k in STATE}

# what the check and the engine's checkpoint read while they run
MODULES = ("ckptlab.engine.tape", "ckptlab.engine.tensor", "ckptlab.engine.ops",
           "ckptlab.engine.layers", "ckptlab.engine.arrays", "ckptlab.recompute.checkpoint",
           "ckptlab.recompute.ledger", "ckptlab.rng", "ckptlab.models",
           "ckptlab.exercises.write.check",
           "ckptlab.exercises.write.checkpoint_ex", "ckptlab.exercises.write.checkpoint_runs",
           "ckptlab.exercises.write.checkpoint_guard")


def fresh_state() -> None:
    """Set the engine's state to a fresh process's: grad on, phase "forward", RNG (0, 0), no
    ledger, store, recompute ops or trace."""
    for k, v in _FRESH.items():
        setattr(tape._state, k, v)


def state_now() -> tuple:
    """(the dropout RNG state (seed, offset), grad mode), read from the state itself (not
    through functions a learner could replace)."""
    s = tape._state
    return (s.seed, s.offset), s.grad_enabled


@contextlib.contextmanager
def kept_state():
    """Context: the engine's state as the caller had it is put back on exit."""
    saved = {k: getattr(tape._state, k) for k in STATE}
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(tape._state, k, v)


def _namespaces():
    """(qualified name, namespace object) of every module in MODULES and every class defined
    in one of them."""
    for name in MODULES:
        module = importlib.import_module(name)
        yield name, module
        for attr, value in list(vars(module).items()):
            if isinstance(value, type) and value.__module__ == name:
                yield f"{name}.{attr}", value


def _attrs(ns) -> dict:
    """A namespace's attributes; a module's without its dunder names, which Python adds itself
    (__warningregistry__, when a warning is issued from it)."""
    return {k: v for k, v in vars(ns).items() if isinstance(ns, type) or not k.startswith("__")}


def snapshot() -> dict:
    """{(namespace name, object): {attribute: value}} for every guarded namespace."""
    return {(label, ns): _attrs(ns) for label, ns in _namespaces()}


class Guard:
    """The guarded attributes as they were when the Guard was made; `changed()` names those
    replaced, added or removed since, and puts them back."""

    def __init__(self, recorded: dict | None = None):
        self.recorded = recorded if recorded is not None else snapshot()

    def changed(self) -> list[str]:
        """The qualified names of what changed (sorted), each undone."""
        names = []
        for (label, ns), before in self.recorded.items():
            now = _attrs(ns)
            for attr in sorted(set(before) | set(now)):
                if attr in before and attr in now and now[attr] is before[attr]:
                    continue
                names.append(f"{label}.{attr}")
                if attr in before:
                    setattr(ns, attr, before[attr])
                else:
                    delattr(ns, attr)
        return names
