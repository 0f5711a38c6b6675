"""Mistakes whose cause has a class of its own (tests/kernel_mistakes_classes.py) get a report
that leads with the output showing the class, names the class in its words, and gives the
class's hint; every other wrong output is diagnosed too ("also ..."). The emulator's poison of
locals (under the check only) makes an accumulator never set read as -1.69e38."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_mistakes_classes import MISTAKES
from test_kernel_exercises import _plant, _solution_code

from ckptlab import device
from ckptlab.emu.build import POISON_FLOAT, POISON_LOCALS
from ckptlab.exercises.write import hints

# words each class's sentence must say, so that the learner reads the class, not only the hint
WORDS = {"no_max": "max subtracted", "scale_power": "scale", "factor": "softmax scale",
         "lane0": "lane 0", "wrong_D": "D", "index_swap": "swap", "dropout_scale": "1/p",
         "leading_dim": "leading dimension", "uninit": "before its first write"}
FAST = {0, 12, 15}  # one overflow, the dropout scale beside a wrong dQ, the poison of locals


@pytest.mark.parametrize("i", [pytest.param(i, marks=[] if i in FAST else [pytest.mark.slow],
                                            id=f"{m[0]}-{i}") for i, m in enumerate(MISTAKES)])
def test_a_mistake_of_a_class_is_named_for_its_class(i, tmp_path):
    name, old, new, status, output, key = MISTAKES[i]
    report = _plant(name, old, new, tmp_path)
    text = str(report)
    assert report.status == status, text
    assert text.startswith(f"wrong: {name}: {output} "), text
    assert key in (report.pattern, hints.family(report.pattern)), text
    assert WORDS[key] in text.splitlines()[0], text
    assert f"hint 1: {hints.GENERIC[key][0]}" in text or key == "factor", text
    second = str(_plant(name, old, new, tmp_path, hint=2))
    hint_lines = [ln for ln in (text + "\n" + second).splitlines() if ln.startswith("hint")]
    for code in _solution_code(name):  # no hint gives away a line of the solution
        assert all(code not in h for h in hint_lines), code


def test_every_wrong_output_is_diagnosed_and_the_most_telling_leads(tmp_path):
    """1/p for 1/(1 - p): dQ and dK are wrong everywhere (first in order), dV by exactly
    (1 - p) / p; the report leads with dV's factor and still names dQ and dK."""
    name, old, new, *_ = MISTAKES[12]
    report = _plant(name, old, new, tmp_path)
    lines = str(report).splitlines()
    assert lines[0].startswith("wrong: dropout_backward: dV ") and "(1 - p) / p" in lines[0]
    assert any(ln.startswith("  also dQ is wrong") for ln in lines), lines
    assert any(ln.startswith("  also dK is wrong") for ln in lines), lines
    assert [o.output for o in report.finding.others] == ["dQ", "dK"]


def test_locals_start_as_the_poison_only_when_asked(tmp_path):
    """A kernel that returns a local it never set: -1.69e38 under kernel_file(poison_locals),
    whatever the register held without it. The emulator's: a GPU build takes no such flag."""
    if device.target() != "emu":
        pytest.skip("the poison of locals is the emulator's")
    src = ('extern "C" __global__ void k(float* y) {\n    float acc;\n'
           '    for (int i = 0; i < 3; ++i) acc += 1.0f;\n    y[threadIdx.x] = acc;\n}\n')
    (tmp_path / "k.cu").write_text(src)
    xp = device.xp()
    outs = []
    for poison in (True, False):
        with device.kernel_file("poison_probe.cu", src, poison_locals=poison):
            y = xp.zeros(32, dtype=np.float32)
            device.load("poison_probe.cu").get_function("k")((1,), (32,), (y,))
            outs.append(np.asarray(device.to_numpy(y)))
    assert np.all(outs[0] == np.float32(POISON_FLOAT)), outs[0]
    assert not np.any(outs[1] == np.float32(POISON_FLOAT)), outs[1]
    assert POISON_LOCALS.startswith("-ftrivial-auto-var-init")
