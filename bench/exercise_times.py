"""How long `python -m ckptlab exercise check NAME` takes, the whole command as a learner runs
it (process start, imports, build, every case, the byte count), for every exercise:

    cold   an empty kernel cache (CKPTLAB_CACHE_DIR a new folder): the emulator's runtime and
           every kernel the check launches are compiled first
    warm   the same cache again: nothing to compile

Each is the solution (the lab's own kernel; for a from-scratch exercise, scratch/NAME, its file
with the lab's kernel bodies written in), so every case runs to the end. Prints the median and
the range over --repeats runs, the machine's load average beside them (the machine is shared:
a busy one is slower).

    python bench/exercise_times.py [--repeats 3] [--only flash_forward,scratch/flash_forward]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ckptlab.exercises import write  # noqa: E402
from ckptlab.exercises.write import scratch  # noqa: E402


def solution_file(name: str, folder: Path) -> Path:
    ex = write.get(name)
    if name == "checkpoint":
        return ex.solution_file
    path = folder / f"{name.replace('/', '_')}{ex.learner_file.suffix}"
    kernel = (ROOT / "kernels" / ex.kernel).read_text()
    path.write_text(scratch.fill(write.shipped_text(name), kernel) if scratch.is_scratch(name)
                    else kernel)
    return path


def run(name: str, path: Path, cache: str) -> float:
    env = {**os.environ, "CKPTLAB_CACHE_DIR": cache}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "ckptlab", "exercise", "check", name, "--file",
                          str(path)], capture_output=True, text=True, env=env, cwd=ROOT)
    seconds = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{name}: the solution did not pass:\n{out.stdout}{out.stderr}")
    return seconds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", default="", help="comma-separated exercise names")
    a = p.parse_args(argv)
    if a.repeats < 1:
        p.error("--repeats must be >= 1")
    names = [n for n in a.only.split(",") if n] or [*write.EXERCISES, *write.SCRATCH]
    for n in names:
        write.get(n)  # an unknown name stops here, before any work
    print(f"{'exercise':<24}{'cold s (median, range)':>28}{'warm s (median, range)':>28}"
          f"{'load':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            path = solution_file(name, Path(tmp))
            cold, warm = [], []
            for _ in range(a.repeats):
                with tempfile.TemporaryDirectory() as cache:
                    cold.append(run(name, path, cache))
                    warm.append(run(name, path, cache))
            load = os.getloadavg()[0]

            def cell(xs):
                return f"{statistics.median(xs):6.1f} [{min(xs):.1f}-{max(xs):.1f}]"

            print(f"{name:<24}{cell(cold):>28}{cell(warm):>28}{load:>8.2f}")
    return 0


if __name__ == "__main__":
    from ckptlab.args import exit_with  # one line for a write error; quiet into | head

    exit_with(main)
