"""The bytes a right answer is shown beside (ckptlab.exercises.write.check._bytes): the learner's
counted bytes per argument against the model's (reads + writes + 4 bytes an atomicAdd), a note
for each argument that differs either way, and the first launch of a kernel launched twice.
The launches are made up here (a recording with known counts), so each sum is done by hand."""

import contextlib
import importlib
from types import SimpleNamespace

import pytest

from ckptlab.emu.counters import ArgTraffic, Launch
from ckptlab.measure.traffic import KernelTraffic

# the module (the package's `check` is the function of that name)
check = importlib.import_module("ckptlab.exercises.write.check")

KERNEL = "toy<4>"
# the model: x read 400 bytes, y written 400, and 3 atomicAdds on acc (12 bytes)
MODEL = KernelTraffic(KERNEL, read={"x": 400, "y": 0, "acc": 0},
                      write={"x": 0, "y": 400, "acc": 0}, atomics={"x": 0, "y": 0, "acc": 3},
                      flops=0, unique_read={"x": 400}, unique_write={"y": 400},
                      unique_atomic={"acc": 4})
RIGHT = {"x": ArgTraffic(read_bytes=400, unique_read_bytes=400),
         "y": ArgTraffic(write_bytes=400, unique_write_bytes=400),
         "acc": ArgTraffic(atomic_ops=3, atomic_bytes=12, unique_read_bytes=4,
                           unique_write_bytes=4)}


def launch(args):
    return Launch(KERNEL, "toy.cu", (1, 1, 1), (32, 1, 1), 0, "counted", 0.0, args=args)


def table(monkeypatch, *launches):
    @contextlib.contextmanager
    def record():
        yield SimpleNamespace(launches=list(launches))

    monkeypatch.setattr(check.emu, "record", record)
    monkeypatch.setattr(check.device, "target", lambda: "emu")
    ex = SimpleNamespace(traffic=lambda case: [MODEL], kernels=(KERNEL,),
                         run=lambda case, inputs: None)
    case = SimpleNamespace(describe=lambda: "n=100")
    return check._bytes(ex, case, {})


def test_the_models_bytes_atomics_four_bytes_each(monkeypatch):
    lines = table(monkeypatch, launch(RIGHT))
    # counted 400 + 400 + 12 = 812, the model's 400 + 400 + 4 * 3 = 812; unique 400 + 400 + 8
    assert lines[2].split()[1:] == ["812", "812", "808", "808"], lines
    assert lines[-1].strip().startswith("the same bytes as the shipped kernel"), lines


@pytest.mark.parametrize("x_bytes,ratio", [(800, "2.00x"), (200, "0.50x")])
def test_more_or_fewer_bytes_of_an_argument_get_a_note(monkeypatch, x_bytes, ratio):
    args = dict(RIGHT, x=ArgTraffic(read_bytes=x_bytes, unique_read_bytes=400))
    lines = table(monkeypatch, launch(args))
    assert lines[-1] == f"  toy moves {x_bytes:,} bytes of x, {ratio} the model's 400", lines
    assert lines[-2].startswith("right, but not the shipped kernel's traffic")


def test_a_kernel_launched_twice_is_counted_by_its_first_launch(monkeypatch):
    again = dict(RIGHT, y=ArgTraffic(write_bytes=40, unique_write_bytes=40))
    lines = table(monkeypatch, launch(RIGHT), launch(again))
    assert lines[-1].strip().startswith("the same bytes as the shipped kernel"), lines
    lines = table(monkeypatch, launch(again), launch(RIGHT))
    assert lines[-1] == "  toy moves 40 bytes of y, 0.10x the model's 400", lines
