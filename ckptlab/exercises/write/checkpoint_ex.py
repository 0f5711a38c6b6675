"""The checkpoint() a learner writes (lab 09), checked against the engine's own
(ckptlab.recompute.checkpoint): the same bytes held until the backward (exactly its input),
bitwise the same gradients, for x and for every parameter fn reads, the recompute's FLOPs
counted as recompute, and the engine state it leaves (the dropout RNG, grad mode) the same.

The cases are in checkpoint_runs. The engine's runs come first, each from a fresh engine state,
before the learner's file is loaded, through a reference to the engine's checkpoint taken when
this module was imported; what the learner's code replaces in the engine is named and undone
(checkpoint_guard). The solution is labs/solutions/checkpoint.py; the learner's file,
labs/exercises/checkpoint.py, is that file with its two steps cut out.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ckptlab.exercises.write import checkpoint_guard, regions
from ckptlab.exercises.write import checkpoint_runs as runs
from ckptlab.exercises.write.check import (
    FAULT,
    MISSING,
    NO_BUILD,
    NOT_ATTEMPTED,
    RIGHT,
    WRONG,
    Report,
    display_name,
    read_learner,
)
from ckptlab.exercises.write.spec import EXERCISE_DIR, LABS_DIR
from ckptlab.recompute import checkpoint as engine

NOTES = {
    1: ("Keep the RNG state first (tape.rng_state): dropout inside fn draws from it, and the",
        "recompute in step 2 must draw the same masks. Then run fn(x) with grad off (the",
        "context manager tape.no_grad): no op inside fn builds a node, so nothing inside is",
        "saved; only the node returned below holds x. Defines: rng (the state), y (fn's",
        "output)."),
    2: ("The node's backward(g): fn again, this time building a graph, and g through it.",
        "Names to use, in the order they are needed: tape.set_rng_state (draw with the",
        "state kept in step 1; take the current one with tape.rng_state first and put it",
        "back after, so that the rest of the backward is not disturbed); x.detach (a copy",
        "of x that requires grad and is a leaf of its own, so the local graph ends there",
        "and not in the graph behind x); tape.enable_grad (a context manager: the backward",
        "runs with grad off, and the recompute must build its ops' nodes); tape.phase (the",
        "engine counts FLOPs by phase, and its own checkpoint runs the recompute under the",
        "phase named \"recompute\": ckptlab/recompute/ledger.py); backward on the recomputed",
        "output, with g (the parameters fn reads get their gradients on that pass); and",
        "x.node.add_grad, which adds to what x may already have from its other consumers. x",
        "may need no gradient at all (a first segment, whose input is data): then x has no",
        "node and gets nothing, while fn's parameters still get theirs."),
}
PLACEHOLDERS = {1: ('raise NotImplementedError("checkpoint: step 1 is not written yet")',),
                2: ('raise NotImplementedError("checkpoint: step 2 is not written yet")',)}

HINTS = {
    "holds_more": (
        "Your checkpoint holds more than its input until the backward. What did fn's ops save "
        "during your forward?",
        "Step 1: fn's forward must run with grad off (the engine's no_grad context); then no op "
        "inside builds a node, and only the node you return holds x."),
    "no_grad_x": (
        "x gets no gradient. Where does the gradient the recompute computes end up?",
        "Step 2: it lands on the leaf copy of x; x gets it only when it is added to x's own node "
        "(add_grad), where x has one."),
    "dropout": (
        "The gradients are wrong only with dropout. Does the recompute draw the same dropout "
        "masks as the first forward?",
        "Step 1 keeps the RNG state; step 2 sets the RNG back to that state before running fn "
        "again, and restores the current state after."),
    "x_twice": (
        "x's gradient is wrong only when x also feeds another op. What happens to the gradient "
        "it already had from that op?",
        "Step 2 must add to x's gradient (add_grad), not replace it: the other path's share is "
        "already there."),
    "chain": (
        "It is wrong only with two checkpoints in a row. Does your recompute build its graph "
        "on x itself, so that the backward walks into the graph behind x?",
        "Step 2 runs fn on a detached copy of x that requires grad, a leaf of its own, and "
        "back-propagates only through that local graph."),
    "params": (
        "x's gradient is right but the parameters inside fn get the wrong one (or none). Does "
        "the backward go through the recompute's graph?",
        "Step 2: the recompute runs with grad on, and g is back-propagated through its output: "
        "the parameters' gradients are accumulated on that pass."),
    "no_graph": (
        "The recompute left nothing to back-propagate through. Was fn run with grad on the "
        "second time?",
        "Step 2: the backward runs with grad off; fn's recompute must be inside the engine's "
        "enable_grad context, so that its ops build the local graph g goes through."),
    "raised": (
        "Your checkpoint raised an error. Which of its lines, and what did that line expect?",
        "Run the case by hand: checkpoint(block, x) for one block of models.MLP, then "
        "backward, and read the traceback."),
    "everywhere": (
        "The gradients differ from the engine's in every case. Which gradient do you "
        "back-propagate, and through which graph?",
        "Step 2: back-propagate the g your backward receives through fn's output recomputed "
        "from a leaf copy of x."),
    "holds_less": (
        "Your checkpoint holds less than its input, yet its backward reads x: the ledger does "
        "not count what your node keeps alive. What does the node you return save?",
        "The node saves x (its saved= argument): what a backward reads is held until then, "
        "and the ledger counts exactly what nodes save."),
    "returns": (
        "checkpoint(fn, x) stands in for fn(x): the caller gets one Tensor, connected to the "
        "graph. What does your function return?",
        "Return the Tensor the file's last line builds: fn(x)'s value as a node whose "
        "backward is your recompute."),
    "x_no_grad": (
        "It fails when x needs no gradient (a first segment: x is the model's input). What is "
        "x's node then, and who still needs a gradient?",
        "Step 2: hand x its gradient only when x has a node to take it; fn's parameters get "
        "theirs from the backward through the recompute either way."),
    "rng_after": (
        "The gradients are right, but after your checkpoint the dropout RNG is not where the "
        "engine's is. Which masks does the next dropout draw?",
        "Step 2: the state current before the recompute (not step 1's) is the one to leave "
        "behind once fn has run again; step 1 only reads the state."),
    "grad_mode": (
        "Your checkpoint leaves grad mode off, so nothing after it builds a graph. Where did "
        "it turn grad mode off, and who turns it back?",
        "Change grad mode only through the tape's context managers (no_grad, enable_grad): "
        "each puts back on exit what it found; a mode set by hand stays set."),
    "recompute_phase": (
        "The ledger counts your recompute's FLOPs as backward work, so the hardware FLOPs "
        "equal the model FLOPs and recompute looks free (lab 08's HFU against MFU). Under "
        "which phase does the engine count a recompute?",
        "Step 2: the engine runs its recompute in the tape's \"recompute\" phase (tape.phase), "
        "with grad on."),
    "replaced": (
        "Your file replaces part of ckptlab (an assignment to a module's function or "
        "attribute). A checkpoint() builds on the engine as it is: which line does that?",
        "Remove the assignment: the check compares with the engine's own checkpoint, and "
        "the labs after this one run on the same engine."),
}


@dataclass(frozen=True)
class PyExercise:
    name: str = "checkpoint"
    lab: str = "09"
    title: str = "checkpoint(): a forward under no_grad, and a node that recomputes"

    @property
    def learner_file(self) -> Path:
        return EXERCISE_DIR / "checkpoint.py"

    @property
    def solution_file(self) -> Path:
        return LABS_DIR / "solutions" / "checkpoint.py"


CHECKPOINT = PyExercise()


def shipped_text(ex: PyExercise = CHECKPOINT) -> str:
    return regions.cut(ex.solution_file.read_text(), ex.name, NOTES, PLACEHOLDERS)


def _load(path: Path):
    """The learner's file as a module, whatever its name ends with."""
    loader = importlib.machinery.SourceFileLoader(f"learner_{path.stem}", str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


CASES = runs.CASES
_ENGINE_CHECKPOINT = engine.checkpoint  # the reference, whatever a learner's file assigns later


def _engine(fn, x):
    return _ENGINE_CHECKPOINT(fn, x)


def _replaced(ex, names: list, hint: int) -> Report:
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return Report(ex.name, FAULT, [
        f"{FAULT}: {ex.name}: your file replaced {shown} (put back now): the check compares "
        "with the engine as it is, and a checkpoint() must not change it",
        f"hint {hint}: {HINTS['replaced'][hint - 1]}"], pattern="replaced")


def check(file=None, hint: int = 1) -> Report:
    """The report on the learner's checkpoint.py (or `file`). The engine's runs come first,
    each from a fresh engine state, before the learner's file is loaded; the caller's engine
    state is put back at the end."""
    with checkpoint_guard.kept_state():
        return _check(file, hint)


def _check(file, hint: int) -> Report:
    ex = CHECKPOINT
    path = Path(file) if file is not None else ex.learner_file
    shown = display_name(path)
    if not path.is_file():
        return Report(ex.name, MISSING, [f"{ex.name}: {shown} is missing; `python -m ckptlab "
                                         f"exercise reset {ex.name}` puts it back as shipped"])
    text, bad = read_learner(path, shown)
    if bad is not None:
        return bad
    if regions.not_attempted(text, shipped_text()):
        return Report(ex.name, NOT_ATTEMPTED, [
            f"not attempted: fill in {shown} (steps 1-2, marked '>>> YOUR CODE'), then check "
            "again"])
    guard = checkpoint_guard.Guard()
    changed = guard.changed  # bound now: the learner's code cannot replace it
    reference = {case: runs.run(_engine, case) for case in CASES}
    try:
        mine = getattr(_load(path), "checkpoint", None)
        if not callable(mine):
            raise AttributeError("it defines no function checkpoint(fn, x)")
    except Exception as e:  # the learner's file: any error is a reason, not a crash
        return Report(ex.name, NO_BUILD, [f"{NO_BUILD}: {ex.name}: importing {shown} raised "
                                          f"{type(e).__name__}: {e}"])
    finally:
        names = changed()
    if names:
        return _replaced(ex, names, hint)
    wrong, state = {}, None
    for case in CASES:
        want = reference[case]
        try:
            got = runs.run(mine, case)
        except runs.Finding as f:
            names = changed()
            return _replaced(ex, names, hint) if names else _wrong(
                ex, f.pattern, hint, f"in case {case}, {f.why}")
        except Exception as e:
            names = changed()
            return _replaced(ex, names, hint) if names else _raised(ex, case, e, hint)
        if names := changed():
            return _replaced(ex, names, hint)
        if (early := runs.state_differs(case, got, want, "forward")) is not None:
            return _wrong(ex, early[0], hint, early[1])  # what every op after it sees
        if got.held != want.held:  # exactly its input: more holds fn's insides, less lies
            more = got.held > want.held
            return _wrong(ex, "holds_more" if more else "holds_less", hint,
                          f"in case {case} your checkpoint holds {got.held:,} bytes when the "
                          f"forward ends, the engine's {want.held:,} (its input alone)")
        if got.grads["x"] is None and want.grads["x"] is not None:
            return _wrong(ex, "no_grad_x", hint, f"in case {case} x has no gradient")
        bad = [k for k in want.grads if (got.grads[k] is None) != (want.grads[k] is None) or (
            want.grads[k] is not None and not np.array_equal(got.grads[k], want.grads[k]))]
        if bad:
            wrong[case] = bad
        state = state or runs.state_differs(case, got, want, "backward")
    if not wrong and state is None:
        return Report(ex.name, RIGHT, [RIGHT, f"{ex.name}: the same bytes held, bitwise the same "
                                       "gradients, the same FLOPs counted as forward and as "
                                       "recompute, and the same RNG state and grad mode after, "
                                       f"as the engine's checkpoint in every case "
                                       f"({', '.join(CASES)})"])
    if not wrong:
        return _wrong(ex, state[0], hint, state[1])
    if "base" not in wrong:
        case = next(c for c in CASES if c in wrong)
        return _wrong(ex, case, hint, f"right in the base case, wrong in case {case}: "
                      f"{', '.join(wrong[case])} differ from the engine's")
    if "no_dropout" not in wrong:
        return _wrong(ex, "dropout", hint, "right without dropout, wrong with it: "
                      f"{', '.join(wrong['base'])} differ from the engine's")
    pattern = "params" if "x" not in wrong["base"] else "everywhere"
    return _wrong(ex, pattern, hint, f"in every case: {', '.join(wrong['base'])} differ from "
                  "the engine's")


def _raised(ex, case: str, e: Exception, hint: int) -> Report:
    if isinstance(e, NotImplementedError):
        return Report(ex.name, WRONG, [f"{WRONG}: {ex.name}: {e}"], pattern="todo")
    pattern = ("no_graph" if "does not require grad" in str(e) else
               case if case != "base" else "raised")
    return Report(ex.name, FAULT, [
        f"{FAULT}: {ex.name}: in case {case}, your checkpoint raised {type(e).__name__}: {e}",
        f"hint {hint}: {HINTS[pattern][hint - 1]}"], pattern=pattern)


def _wrong(ex, pattern: str, hint: int, why: str) -> Report:
    return Report(ex.name, WRONG, [f"{WRONG}: {ex.name}: {why}.",
                                   f"hint {hint}: {HINTS[pattern][hint - 1]}"], pattern=pattern)
