"""The emulator's runtime at another revision against this checkout's, everything else equal.

    python bench/emu_ab.py REV [--rounds 3]

Builds a temporary git worktree of this checkout's HEAD with the runtime's sources (the shim
and every file the emulator compiles into a module, ckptlab/emu/build.py's SHIM and RUNTIME)
taken from REV, then alternates the two in separate processes, `--rounds` times: each process
times SGEMM 256^3 (15 launches) and the flash forward + backward at N = 1024, d = 64 (3 pairs),
fast and counted (no race check), on one worker, as CPU time of the launching thread. It prints
per case the median of the rounds' medians and the rounds' range, and the speed-up; outputs
must be bitwise equal between the two (it stops if not). Uncommitted changes to the runtime in
this checkout are measured as they are: edit a constant, rerun, compare against HEAD. Where
abi.h differs between REV and this checkout, the structures Python passes changed with it, so
"before" takes all of ckptlab/emu/ from REV (its loader, its settings), not only the runtime.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EMU, ABI = "ckptlab/emu", "ckptlab/emu/abi.h"

CHILD = r"""
import hashlib, json, statistics, time
import numpy as np
from ckptlab import device, emu
from ckptlab.kernels import flash

def cpu_ms(fn, reps):
    fn()  # warm-up: builds the module if needed
    ts = []
    for _ in range(reps):
        c0 = time.thread_time(); fn(); ts.append(time.thread_time() - c0)
    return statistics.median(ts) * 1e3

rng = np.random.default_rng(0)
n = 256
A, B = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
C = np.empty((n, n), np.float32)
q, k, v, dO = (rng.standard_normal((1, 1, 1024, 64)).astype(np.float32) for _ in range(4))
out, digest = {}, hashlib.sha256()
with device.use("emu"):
    f = device.load("sgemm_tiled.cu").get_function("sgemm_tiled")
    for mode in ("fast", "counted"):
        with emu.settings(mode=mode, race_check=False, workers=1):
            out[f"SGEMM 256^3 {mode}"] = cpu_ms(
                lambda: f((16, 16), (16, 16), (A, B, C, np.int32(n), np.int32(n), np.int32(n))), 15)
            digest.update(C.tobytes())
            res = {}
            def pair():
                o, s = flash.flash_forward(q, k, v)
                res["g"] = [o, *flash.flash_backward(dO, q, k, v, s)]
            out[f"flash pair N=1024 d=64 {mode}"] = cpu_ms(pair, 3)
            for a in res["g"]:
                digest.update(np.ascontiguousarray(a).tobytes())
print(json.dumps(dict(ms=out, digest=digest.hexdigest())))
"""


def runtime_files() -> list[str]:
    sys.path.insert(0, str(ROOT))
    from ckptlab.emu import build
    return [str(p.relative_to(ROOT)) for p in [build.SHIM, *build.RUNTIME]]


def measure(tree: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    p = subprocess.run([sys.executable, "-c", CHILD], cwd=tree, env=env, capture_output=True,
                       text=True)
    if p.returncode:
        raise SystemExit(f"emu_ab: the run in {tree} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rev", help="the revision whose runtime is 'before' (a commit, tag, branch)")
    ap.add_argument("--rounds", type=int, default=3, help="alternations (default 3)")
    a = ap.parse_args(argv)
    if a.rounds < 1:
        ap.error("--rounds: at least 1")
    git = ["git", "-C", str(ROOT)]
    if subprocess.run([*git, "rev-parse", "--verify", "-q", f"{a.rev}^{{commit}}"],
                      capture_output=True).returncode:
        ap.error(f"{a.rev!r} is not a revision of {ROOT}")
    with tempfile.TemporaryDirectory(prefix="emu_ab-") as tmp:
        before = Path(tmp) / "before"
        subprocess.run([*git, "worktree", "add", "-q", "--detach", str(before), "HEAD"],
                       check=True)
        try:
            files = runtime_files()
            if subprocess.run([*git, "diff", "--quiet", a.rev, "--", ABI]).returncode:
                files = [EMU]  # the Python side reads and mirrors abi.h: it must match it
                print(f"{ABI} differs between {a.rev} and this checkout: 'before' takes all "
                      f"of {EMU}/ from {a.rev}, its Python side too", flush=True)
            subprocess.run(["git", "-C", str(before), "checkout", "-q", a.rev, "--", *files],
                           check=True)
            rounds = {"before": [], "after": []}
            for r in range(a.rounds):
                for label, tree in (("before", before), ("after", ROOT)):
                    rounds[label].append(measure(tree))
                    print(f"round {r + 1} {label}: " + ", ".join(
                        f"{k} {v:.1f}" for k, v in rounds[label][-1]["ms"].items()), flush=True)
                if rounds["before"][-1]["digest"] != rounds["after"][-1]["digest"]:
                    raise SystemExit("emu_ab: the outputs differ between the two runtimes")
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(before)], check=False)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    print(f"\nCPU ms, one worker: median of {a.rounds} rounds' medians (range); load average "
          f"{load}")
    print(f"{'case':<32}{'before ' + a.rev:>26}{'after (this checkout)':>26}{'speed-up':>10}")
    def cell(v):
        return f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})"

    for case in rounds["after"][0]["ms"]:
        b = [x["ms"][case] for x in rounds["before"]]
        c = [x["ms"][case] for x in rounds["after"]]
        print(f"{case:<32}{cell(b):>26}{cell(c):>26}"
              f"{statistics.median(b) / statistics.median(c):>9.2f}x")
    return 0


if __name__ == "__main__":
    from ckptlab.args import exit_with  # one line for a write error; quiet into | head

    exit_with(main)
