"""How long `python -m ckptlab exercise check NAME` takes, the whole command as a learner runs
it (process start, imports, build, every case, the byte count), for every exercise:

    cold   an empty kernel cache (CKPTLAB_CACHE_DIR a new folder): the emulator's runtime and
           every kernel the check launches are compiled first
    warm   the same cache again: nothing to compile

Each is the solution (the lab's own kernel; for a from-scratch exercise, scratch/NAME, its file
with the lab's kernel bodies written in), so every case runs to the end. Prints the median and
the range over --repeats runs of the wall time, the median CPU time (user + system, of the
command and the compilers it starts) and the machine's load average beside them. The check runs
on one core, so on an idle machine its wall time is its CPU time; on a busy, shared one the wall
time grows with the load and the CPU time stays.

    python bench/exercise_times.py [--repeats 3] [--only flash_forward,scratch/flash_forward]
"""

from __future__ import annotations

import argparse
import os
import resource
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


def cpu_seconds() -> float:
    """User + system time of every finished child process so far (and theirs)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(name: str, path: Path, cache: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one `exercise check` of `path`."""
    env = {**os.environ, "CKPTLAB_CACHE_DIR": cache}
    t0, c0 = time.perf_counter(), cpu_seconds()
    out = subprocess.run([sys.executable, "-m", "ckptlab", "exercise", "check", name, "--file",
                          str(path)], capture_output=True, text=True, env=env, cwd=ROOT)
    seconds, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    if out.returncode != 0:
        raise SystemExit(f"{name}: the solution did not pass:\n{out.stdout}{out.stderr}")
    return seconds, cpu


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
    print(f"{'exercise':<24}{'cold s (median, range)':>24}{'cpu s':>7}"
          f"{'warm s (median, range)':>24}{'cpu s':>7}{'load':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            path = solution_file(name, Path(tmp))
            cold, warm = [], []
            for _ in range(a.repeats):
                with tempfile.TemporaryDirectory() as cache:
                    cold.append(run(name, path, cache))
                    warm.append(run(name, path, cache))
            load = os.getloadavg()[0]

            def cell(runs):
                wall = [w for w, _ in runs]
                return (f"{statistics.median(wall):6.1f} [{min(wall):.1f}-{max(wall):.1f}]"
                        .rjust(24) + f"{statistics.median(c for _, c in runs):7.1f}")

            print(f"{name:<24}{cell(cold)}{cell(warm)}{load:>7.2f}")
    return 0


if __name__ == "__main__":
    from ckptlab.args import exit_with  # one line for a write error; quiet into | head

    exit_with(main)
