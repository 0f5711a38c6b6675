"""What the access trace costs on the small launches it is meant for.

    python bench/emu_trace.py [--repeats 15]

Times, on one worker in counted mode without the race check (CPU time of this thread), the
tiled SGEMM at M, N, K = 40, 24, 56 (16 x 16 tiles: lab 01's exercise size) and the flash
forward at B = H = 1, N = 40, d = 16, Br = Bc = 16, each launch untraced and traced in turn
(the traced time includes turning the events into per-argument rows, tracing.collect), then
one query per argument (count, block_map) and one access map drawn. Prints the median and
quartiles of each, the events and what they hold in memory.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ckptlab import device, emu, kernels  # noqa: E402
from ckptlab.emu import tracing  # noqa: E402
from ckptlab.measure.access_plots import plot_access_map  # noqa: E402
from ckptlab.measure.timing import quartiles  # noqa: E402


def cpu_ms(fn) -> float:
    t0 = time.thread_time()
    fn()
    return (time.thread_time() - t0) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=15, help="launches of each kind (15)")
    a = ap.parse_args(argv)
    if a.repeats < 1:
        ap.error("--repeats: at least 1")
    rng = np.random.default_rng(0)
    M, N, K = 40, 24, 56
    A = rng.standard_normal((M, K), dtype=np.float32)
    B = rng.standard_normal((K, N), dtype=np.float32)
    C = np.empty((M, N), np.float32)
    q, k, v = (rng.standard_normal((1, 1, 40, 16)).astype(np.float32) for _ in range(3))
    with device.use("emu"), emu.settings(mode="counted", race_check=False, workers=1):
        f = device.load("sgemm_tiled.cu").get_function("sgemm_tiled")
        cases = {
            "SGEMM 40x24x56": lambda: f((2, 3), (16, 16), (A, B, C, np.int32(M), np.int32(N),
                                                           np.int32(K))),
            "flash fwd N=40 d=16": lambda: kernels.flash_forward(q, k, v, tiles=(16, 16)),
        }
        print(f"CPU ms, one worker, counted, no race check: median [quartiles] of {a.repeats}")
        for name, launch in cases.items():
            launch()  # builds the module
            times: dict = {"untraced": [], "traced": [], "queries": [], "figure": []}
            for _ in range(a.repeats):
                times["untraced"].append(cpu_ms(launch))
                with emu.trace() as tr:
                    times["traced"].append(cpu_ms(launch))
                t = tr.last
                times["queries"].append(cpu_ms(lambda t=t: [
                    (x.count("read"), x.block_map("write")) for x in t.args.values()]))
                times["figure"].append(cpu_ms(lambda t=t: plot_access_map(
                    t, [n for n, x in t.args.items() if x.accesses], kind="read",
                    block=(1, 0))))
            rows = sum(len(x.element) for x in t.args.values())
            held = sum(x.element.nbytes + x.block.nbytes + x.thread.nbytes + x.kind.nbytes
                       for x in t.args.values())
            print(f"\n{name}: {len(t.events):,} events ({len(t.events) * tracing.EVENT_BYTES:,} "
                  f"bytes), {rows:,} element rows ({held:,} bytes)")
            for kind, ts in times.items():
                med, lo, hi = quartiles(ts)
                print(f"  {kind:<10}{med:>9.2f} [{lo:.2f}-{hi:.2f}]")
    return 0


if __name__ == "__main__":
    from ckptlab.args import exit_with  # one line for a write error; quiet into | head

    exit_with(main)
