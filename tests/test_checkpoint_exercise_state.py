"""The checkpoint() exercise's check beyond the gradients: the engine state a checkpoint leaves
(the dropout RNG, grad mode), the FLOPs its recompute is counted as, the bytes it holds (exactly
its input), an input that needs no gradient, what it returns, and a reference the learner's file
cannot reach: the engine's checkpoint, run in a clean state, before the learner's code loads."""

from __future__ import annotations

import pytest

from ckptlab.engine import tape
from ckptlab.exercises import write
from ckptlab.recompute import checkpoint as engine

RETURN = ('    return make(y.data, "checkpoint", (x,), backward, saved=(x,), force=True, '
          'kind="checkpoint")')
RECOMPUTE = ('        with tape.enable_grad(), tape.phase("recompute"):  # its FLOPs: recompute, '
             'not model\n')


def planted(tmp_path, old: str, new: str, name: str = "checkpoint.py"):
    sol = write.get("checkpoint").solution_file.read_text()
    assert old in sol, old
    path = tmp_path / name
    path.write_text(sol.replace(old, new, 1))
    return path


def verdict(path, hint: int = 1):
    report = write.check("checkpoint", file=path, hint=hint)
    return report.status, report.pattern, str(report)


def test_the_solution_is_right_in_every_case_and_names_them():
    status, _, text = verdict(write.get("checkpoint").solution_file)
    assert status == "right", text
    for case in ("base", "no_dropout", "x_twice", "chain", "x_no_grad"):
        assert case in text, text


def test_an_rng_state_not_put_back_after_the_recompute_is_wrong(tmp_path):
    """The next step would draw the same dropout masks again: right gradients, wrong state."""
    status, pattern, text = verdict(planted(tmp_path, "        tape.set_rng_state(now)\n", ""))
    assert (status, pattern) == ("wrong", "rng_after"), text
    assert "same dropout masks" in text and "hint 1: " in text


def test_an_rng_state_rewound_after_the_forward_is_wrong(tmp_path):
    """The layers after the checkpoint would draw the masks fn drew."""
    path = planted(tmp_path, "        y = fn(x)\n",
                   "        y = fn(x)\n    tape.set_rng_state(rng)\n")
    status, pattern, text = verdict(path)
    assert (status, pattern) == ("wrong", "rng_after"), text
    assert "after the forward" in text


def test_grad_mode_left_off_after_the_backward_is_wrong_and_the_caller_keeps_its_own(tmp_path):
    path = planted(tmp_path, RECOMPUTE + "            y2 = fn(local)\n",
                   "        tape._state.grad_enabled = True\n"
                   "        with tape.phase(\"recompute\"):\n"
                   "            y2 = fn(local)\n"
                   "        tape._state.grad_enabled = False  # as the forward had it\n")
    status, pattern, text = verdict(path)
    assert (status, pattern) == ("wrong", "grad_mode"), text
    assert "grad mode is off after the backward" in text
    assert tape.is_grad_enabled()


def test_grad_mode_left_off_after_the_forward_is_named(tmp_path):
    path = planted(tmp_path, "    with tape.no_grad():  # no op inside fn builds a node, so none "
                   "saves anything\n        y = fn(x)\n",
                   "    tape._state.grad_enabled = False\n    y = fn(x)\n")
    status, pattern, text = verdict(path)
    assert (status, pattern) == ("wrong", "grad_mode"), text
    assert "grad mode is off after the forward" in text
    assert tape.is_grad_enabled()


def test_the_reference_runs_in_a_clean_state_and_the_callers_state_is_put_back():
    """Called with grad off and the RNG elsewhere (a notebook after a careless cell), the
    check still runs both checkpoints as a fresh process would, and leaves the state as found."""
    sol = write.get("checkpoint").solution_file
    before = tape.rng_state()
    try:
        tape.set_rng_state((7, 123))
        with tape.no_grad():
            report = write.check("checkpoint", file=sol)
            assert not tape.is_grad_enabled()
        assert report.status == "right", str(report)
        assert tape.rng_state() == (7, 123)
    finally:
        tape.set_rng_state(before)


def test_a_file_that_replaces_the_engines_checkpoint_is_refused_and_undone(tmp_path):
    """A wrong checkpoint (no RNG restored) that also installs itself as the engine's: the
    check's reference is the engine's own all the same, and the replacement is named."""
    sol = write.get("checkpoint").solution_file.read_text()
    path = tmp_path / "checkpoint.py"
    path.write_text(sol.replace("        tape.set_rng_state(rng)\n", "", 1) +
                    "\n\nimport ckptlab.recompute.checkpoint as _engine  # noqa\n"
                    "_engine.checkpoint = checkpoint\n")
    original = engine.checkpoint
    status, pattern, text = verdict(path)
    assert status != "right" and pattern == "replaced", text
    assert "ckptlab.recompute.checkpoint.checkpoint" in text
    assert engine.checkpoint is original


def test_a_file_that_replaces_a_tape_function_during_its_backward_is_refused(tmp_path):
    path = planted(tmp_path, "        tape.set_rng_state(now)\n",
                   "        tape.set_rng_state(now)\n        tape.rng_state = lambda: now\n")
    original = tape.rng_state
    status, pattern, text = verdict(path)
    assert pattern == "replaced" and "ckptlab.engine.tape.rng_state" in text, text
    assert tape.rng_state is original


def test_x_without_grad_is_a_case_an_unconditional_add_grad_fails(tmp_path):
    """A first segment: x is the model's input and needs no gradient (x.node is None)."""
    path = planted(tmp_path, "        if x.node is not None:\n            x.node.add_grad",
                   "        if True:\n            x.node.add_grad")
    status, pattern, text = verdict(path)
    assert (status, pattern) == ("fault", "x_no_grad"), text
    assert "in case x_no_grad" in text and "AttributeError" in text


def test_the_engines_checkpoint_handles_an_input_without_grad():
    from ckptlab import models
    from ckptlab.engine.tensor import Tensor

    mlp = models.MLP(width=8, layers=1, dropout=0.0, seed=0)
    y = engine.checkpoint(mlp.blocks[0], Tensor([[1.0] * 8] * 2))
    y.sum().backward()
    assert all(p.grad is not None for k, p in mlp.params.items() if k.startswith("0."))


def test_a_recompute_not_counted_as_recompute_is_wrong(tmp_path):
    """Its FLOPs land in the backward phase: the ledger's hardware FLOPs then equal the model
    FLOPs, and lab 08's HFU against MFU says recompute is free."""
    path = planted(tmp_path, RECOMPUTE, "        with tape.enable_grad():\n")
    status, pattern, text = verdict(path)
    assert (status, pattern) == ("wrong", "recompute_phase"), text
    assert "counted as backward work" in text and "FLOPs as recompute" in text


@pytest.mark.parametrize("new,says", [
    ("    make(y.data", "your checkpoint returned None: it must return fn(x)'s value as a "
                      "Tensor node"),
    ("    return y, make(y.data", "your checkpoint returned a tuple"),
    ("    return y\n    make(y.data", "your checkpoint returned a Tensor that is not connected"),
    ("    return y.data\n    make(y.data", "your checkpoint returned a ndarray"),
])
def test_what_checkpoint_returns_gets_a_clear_message(new, says, tmp_path):
    status, pattern, text = verdict(planted(tmp_path, "    return make(y.data", new))
    assert (status, pattern) == ("wrong", "returns"), text
    assert says in text and "TypeError" not in text and "raised" not in text


def test_a_checkpoint_holding_twice_its_input_is_wrong(tmp_path):
    """It also keeps its output: 2x the engine's bytes (kills a check that allows up to 2x)."""
    status, pattern, text = verdict(planted(tmp_path, RETURN, RETURN.replace(
        "saved=(x,)", "saved=(x, y)")))
    assert (status, pattern) == ("wrong", "holds_more"), text
    assert "2,048 bytes" in text and "1,024" in text


def test_a_checkpoint_holding_less_than_its_input_is_wrong(tmp_path):
    """Its backward still reads x, which the ledger no longer counts: the bytes a lab reports
    would be short by the input the closure keeps alive."""
    status, pattern, text = verdict(planted(tmp_path, RETURN, RETURN.replace(
        "saved=(x,)", "saved=()")))
    assert (status, pattern) == ("wrong", "holds_less"), text


def test_the_reference_is_the_engines_even_if_replaced_before_the_check(tmp_path, monkeypatch):
    """A notebook that imported the learner's file before checking it: the engine's
    checkpoint was already replaced when the check began; the reference is still the engine's
    own (kept when the checker was imported)."""
    from ckptlab.exercises.write.checkpoint_ex import _load

    path = planted(tmp_path, "        tape.set_rng_state(rng)\n", "")
    monkeypatch.setattr(engine, "checkpoint", _load(path).checkpoint)
    status, pattern, text = verdict(path)
    assert (status, pattern) == ("wrong", "dropout"), text


def test_a_file_that_turns_dropout_off_at_import_is_refused(tmp_path):
    """Without masks the RNG mistake (no state restored for the recompute) would not show:
    the dropout's mask drawing, replaced when the file loads, is named and undone."""
    from ckptlab import rng

    sol = write.get("checkpoint").solution_file.read_text()
    path = tmp_path / "checkpoint.py"
    path.write_text(sol.replace("        tape.set_rng_state(rng)\n", "", 1) +
                    "\n\nimport numpy as _np  # noqa\nimport ckptlab.rng as _rng  # noqa\n"
                    "_rng.keep_mask = lambda seed, offset, shape, p: _np.ones(shape, bool)\n")
    original = rng.keep_mask
    status, pattern, text = verdict(path)
    assert (status, pattern) == ("fault", "replaced") and "ckptlab.rng.keep_mask" in text, text
    assert rng.keep_mask is original
