"""bench/exercise_times.py reports the CPU time of each check beside its wall time: the CPU time
of the command and of the compilers it starts, which a shared machine's load does not inflate."""

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "exercise_times.py"


def load():
    spec = importlib.util.spec_from_file_location("exercise_times", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_seconds_count_a_child_and_its_children_not_its_sleep():
    bench = load()
    busy = "import subprocess, sys; subprocess.run([sys.executable, '-c', " \
           "'sum(range(3 * 10**7))']); __import__('time').sleep(0.5)"
    c0, t0 = bench.cpu_seconds(), time.perf_counter()
    subprocess.run([sys.executable, "-c", busy], check=True)
    cpu, wall = bench.cpu_seconds() - c0, time.perf_counter() - t0
    assert cpu > 0.2, cpu  # the grandchild's loop: a few tenths of a second of CPU
    assert cpu < wall - 0.4, (cpu, wall)  # the half second of sleep is wall time only
