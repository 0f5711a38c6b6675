"""More than one process on PyTorch's distributed engine (ckptlab.torch.demo, dist,
tensor_parallel): one spawn of two ranks (gloo on the CPU) trains a small GPT with DDP
(ckptlab flash attention, a ckptlab schedule) and runs a tensor-parallel block. Each rank's
measured peak of saved bytes equals ckptlab's prediction for its plan; the losses equal a
one-process run within float32 rounding; the block's per-rank bytes equal Korthikanti et al.'s
formula for t = 2 (plus LayerNorm's statistics, which the formula leaves out) and its outputs
and gradients those of the unsplit block. Also: ckptlab.torch without PyTorch."""

import subprocess
import sys

import pytest
from torch_oracle import torch  # skips this module without PyTorch

from ckptlab.torch import demo
from ckptlab.torch import tensor_parallel as tp

CFG = demo.Config(steps=2, layers=3, width=32, heads=2, seq=17, batch=4, vocab=32)
SHAPE = tp.Shape(s=17, b=2, h=32, a=2)


@pytest.fixture(scope="module")
def result():
    return demo.run(2, CFG, SHAPE)


def test_ddp_ranks_hold_what_ckptlab_predicts(result):
    assert result["backend"] == "gloo" or torch.cuda.is_available()
    for r in result["ranks"]:
        assert r["peaks"] == [r["predicted"]] * CFG.steps
    assert result["ranks"][0]["plan"] != str(list(range(CFG.layers)))  # something checkpointed
    # each rank holds its half of the batch: less than the one process holding all of it
    assert result["ranks"][0]["predicted"] < result["reference"]["predicted"]


def test_ddp_losses_equal_one_process(result):
    ref = result["reference"]["losses"]
    for r in result["ranks"]:
        for a, b in zip(r["losses"], ref, strict=True):
            assert abs(a - b) <= demo.TOLERANCE * abs(b)
    assert ref[-1] < ref[0]  # it trains
    assert demo.check_ddp(result) == []


def test_tensor_parallel_bytes_equal_korthikanti(result):
    s, b, h, a = SHAPE.s, SHAPE.b, SHAPE.h, SHAPE.a
    stats = 2 * 2 * 4 * s * b  # two LayerNorms' mean and rstd, fp32, per token
    sbh = s * b * h
    # the paper's terms at 4 bytes a value, masks 1 byte: sbh(18 + 48/t) + 9 a s^2 b / t
    for t, ranks in ((1, [result["tp_reference"]]), (2, result["tp"])):
        for out in ranks:
            assert out["none"]["held"] == 18 * sbh + 48 * sbh // t + 9 * a * s * s * b // t + stats
            assert out["full"]["held"] == 4 * sbh  # the block's input only
            assert out["full"]["peak"] == out["none"]["held"]  # the recompute holds it all
            assert out["none"]["held"] == tp.predicted(SHAPE, t, "none")
    assert tp.check(result["tp"], result["tp_reference"], SHAPE) == []


def test_the_report_says_all_equal(result):
    text = demo.report(result)
    assert "MISMATCH" not in text and "all equal" in text and "Korthikanti" in text


def test_without_pytorch_import_says_how_to_install():
    """A fresh interpreter where `import torch` fails: one ImportError line naming the fix."""
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'torch' or name.startswith('torch.'):\n"
            "            raise ImportError('No module named torch')\n"
            "sys.meta_path.insert(0, Block())\n"
            "try:\n"
            "    import ckptlab.torch\n"
            "except ImportError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert "\n" not in line and "pip install -e '.[torch]'" in line and "torch==2.13.0" in line
