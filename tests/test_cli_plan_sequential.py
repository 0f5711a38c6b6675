"""python -m ckptlab plan --sequential: a torch.nn.Sequential planned from its measured profile.
The chosen peak is the model states (ZeRO's arithmetic, by hand) plus the activations ckptlab
predicts for the chosen schedule; a larger GPU never recomputes more; bad input is one line."""

import pytest

torch = pytest.importorskip("torch")

from ckptlab.cli import main as cli  # noqa: E402
from ckptlab.cli import plan_sequential as ps  # noqa: E402
from ckptlab.recompute import schedules  # noqa: E402
from ckptlab.torch.profile import profile  # noqa: E402

GIB = 1024**3


def build():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(48, 96), torch.nn.GELU(),
                                                     torch.nn.Linear(96, 48))
                                 for _ in range(6)])


def test_plan_adds_states_to_the_measured_activations():
    modules, x = ps.load("test_cli_plan_sequential:build", "33,48")
    psi = 6 * (48 * 96 + 96 + 96 * 48 + 48)
    none = schedules.none(6).predict(profile(modules, x)).peak_bytes
    states = 16 * psi  # fp32 Adam: 4 + 4 + 8 bytes a parameter, not sharded with ZeRO-0
    memory = states + 0.6 * none
    rows = ps.plan(modules, x, 1, "a100", memory, "fp32")
    (row,) = rows
    assert row["peak"] <= memory and row["recompute"] > 0
    assert row["peak"] == states + row["activations"]
    assert ps.plan(modules, x, 1, "a100", states + none, "fp32")[0]["recompute"] == 0
    # on 2 GPUs, ZeRO-3: 16 psi / 2 of states, plus the largest module gathered (2 x 4 bytes
    # a parameter) and its unsharded gradients (4)
    z3 = ps.plan(modules, x, 2, "a100", memory, "fp32")[3]
    assert z3["peak"] == 16 * psi // 2 + 12 * (psi // 6) + z3["activations"]
    assert z3["recompute"] <= row["recompute"]


def test_cli_and_bad_input(capsys):
    assert cli.main(["plan", "--sequential", "test_cli_plan_sequential:build", "--input-shape",
                     "33,48", "--memory-gb", "1", "--recipe", "fp32"]) == 0
    assert "chosen: ZeRO-0" in capsys.readouterr().out
    assert cli.main(["plan", "--sequential", "test_cli_plan_sequential:nothing",
                     "--input-shape", "33,48", "--memory-gb", "1"]) == 2
    assert "cannot load it" in capsys.readouterr().err
    assert cli.main(["plan", "--sequential", "test_cli_plan_sequential:build",
                     "--memory-gb", "1"]) == 2
    assert "needs --input-shape" in capsys.readouterr().err


def broken():
    raise RuntimeError("no weights here\nsecond line")


NOT_A_FUNCTION = 3


@pytest.mark.parametrize("spec,shape,msg", [
    ("test_cli_plan_sequential:broken", "33,48", "broken() raised RuntimeError: no weights here"),
    ("test_cli_plan_sequential:NOT_A_FUNCTION", "33,48", "is a int, not a function"),
    ("test_cli_plan_sequential:build", "0,48", "--input-shape: expected positive ints"),
    ("test_cli_plan_sequential:build", "100000000,100000000", "needs ~"),
])
def test_a_factory_or_shape_that_fails_is_one_line(capsys, spec, shape, msg):
    assert cli.main(["plan", "--sequential", spec, "--input-shape", shape,
                     "--memory-gb", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and "\n" not in err and "Traceback" not in err
