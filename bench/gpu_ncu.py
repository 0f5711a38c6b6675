"""Measured DRAM bytes of ckptlab's attention kernels, every case profiled by ONE ncu run of ONE
Python process: starting Python, CuPy and ncu once per case (bench attention --ncu does that) put
four start-ups in a 70 s step. A marker kernel launched before each case splits ncu's launch list.

    python bench/gpu_ncu.py --out DIR [--n 256,1024] [--batch 2] [--heads 16] [--d 64]
                            [--impl naive,stored,flash] [--timeout 60]

Writes DIR/ncu_bytes.csv (per case: measured bytes = the sum of dram__bytes_read.sum and
dram__bytes_write.sum over its attn_ launches, the launch count, and the modeled bytes of
ckptlab.measure.traffic where it has the method) and DIR/ncu_raw.txt (ncu's own output).

Exit status: 0 measured; 3 SKIPPED, with the reason on the last line: ncu is not on the PATH, or
it cannot read the GPU's counters here (as under gVisor: «Failed to initialize the profiler:
LibraryNotLoaded»; or ERR_NVGPUCTRPERM without the permission): a fact of the machine, not a
failure of ckptlab; 1 anything else (the profile ran and something went wrong).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MARKER = "attn_ncu_case_marker"  # matches the attn_ filter; launched before each case
SKIPPED = 3
# What ncu prints when it cannot read the counters on this machine (seen on the lent H200 under
# gVisor, per the device tool's notes; NVIDIA's ERR_NVGPUCTRPERM page): checked in this order,
# the first found is the reason given.
COUNTERS_UNAVAILABLE = (
    "Failed to initialize the profiler",
    "LibraryNotLoaded",
    "ERR_NVGPUCTRPERM",
    "Profiling is not supported on this device",
    "not supported on this device",
)


def counters_unavailable(text: str) -> str | None:
    """The line of ncu's output that says it cannot profile here, or None."""
    for needle in COUNTERS_UNAVAILABLE:
        for line in text.splitlines():
            if needle in line:
                return line.strip()
    return None


def cases(ns, impls, B, H, d) -> list[dict]:
    return [dict(impl=impl, B=B, H=H, N=n, d=d, causal=False) for n in ns for impl in impls]


# ---------------------------------------------------------------- the profiled process (GPU)


def child(case_list: list[dict]) -> None:
    """Under ncu: for each case, the marker kernel, then one forward + backward."""
    sys.path.insert(0, str(HERE))
    from gpu_peer import ckptlab_methods

    from ckptlab import device, kernels

    device.use("cuda")
    cp = device.xp("cuda")
    marker = cp.RawKernel(f'extern "C" __global__ void {MARKER}(int k) {{}}', MARKER)
    methods = ckptlab_methods()
    for k, c in enumerate(case_list):
        q, k_, v, dO = kernels.random_inputs(c["B"], c["H"], c["N"], c["d"])
        fwd, bwd = methods[c["impl"]]
        device.synchronize()
        marker((1,), (1,), (cp.int32(k),))
        _, saved = fwd(q, k_, v, causal=c["causal"])
        bwd(dO, q, k_, v, saved)
        device.synchronize()
        print(f"case {k} done: {c}", flush=True)


# ---------------------------------------------------------------- the parent (any machine)


def split_by_marker(launches: list[dict], n_cases: int) -> list[list[dict]]:
    """ncu's launches (in launch order) cut at each marker: one list per case."""
    groups: list[list[dict]] = []
    for r in launches:
        if r["kernel"] == MARKER:
            groups.append([])
        elif not groups:
            raise ValueError(f"launch {r['launch_id']} ({r['kernel']}) came before any marker")
        else:
            groups[-1].append(r)
    if len(groups) != n_cases:
        raise ValueError(f"expected {n_cases} case markers in ncu's output, found {len(groups)}")
    return groups


def modeled_bytes(c: dict):
    from ckptlab.measure import traffic

    if c["impl"] not in traffic.METHODS:
        return None
    runs = traffic.launches(c["impl"], c["B"], c["H"], c["N"], c["N"], c["d"], c["causal"])
    return traffic.totals(runs)["bytes"]


def profile(case_list, out: Path, timeout_s: float) -> int:
    from ckptlab import measure
    from ckptlab.cli.report import fmt_bytes, write_csv

    if shutil.which("ncu") is None:
        print("SKIPPED: ncu (Nsight Compute) is not on the PATH")
        return SKIPPED
    code = (f"import json, sys; sys.path.insert(0, {str(HERE)!r}); import gpu_ncu; "
            f"gpu_ncu.child(json.loads({json.dumps(case_list)!r}))")
    argv = measure.ncu_command(code, kernel_regex="attn_")
    print("$ " + " ".join(argv[:-1]) + " '<child: " + str(len(case_list)) + " cases>'",
          flush=True)
    env = dict(os.environ)
    root = str(HERE.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env)
        text, rc = proc.stdout + "\n" + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:  # its partial output may come as bytes
        text = "\n".join(x.decode(errors="replace") if isinstance(x, bytes) else x
                         for x in (e.stdout, e.stderr) if x)
        (out / "ncu_raw.txt").write_text(text)
        print(f"ncu did not finish within {timeout_s:.0f} s (see ncu_raw.txt)")
        return 1
    (out / "ncu_raw.txt").write_text(text)
    reason = counters_unavailable(text)
    if reason:
        print(f"SKIPPED: ncu cannot read the GPU's performance counters here: {reason}")
        return SKIPPED
    try:
        groups = split_by_marker(measure.parse_ncu_csv(text), len(case_list))
    except ValueError as e:
        tail = "\n".join(text.strip().splitlines()[-8:])
        print(f"ncu's output could not be read ({e}); ncu exit {rc}; last lines:\n{tail}")
        return 1
    rows = []
    for c, launches in zip(case_list, groups, strict=True):
        measured = sum(x["bytes_total"] for x in launches)
        model = modeled_bytes(c)
        rows.append(dict(c, launches=len(launches), measured_bytes=measured,
                         modeled_bytes=model, measured_over_modeled=(
                             measured / model if model else None),
                         kernels=" ".join(x["kernel"] for x in launches)))
        print(f"{c['impl']:<10} N={c['N']:<6} B={c['B']} H={c['H']} d={c['d']}: measured "
              f"{fmt_bytes(measured)} in {len(launches)} launches"
              + (f", modeled {fmt_bytes(model)} ({measured / model:.2f}x)" if model else ""))
    write_csv(rows, out / "ncu_bytes.csv")
    if rc != 0:
        print(f"ncu exited with {rc} although every case was measured")
        return 1
    return 0


def main(argv=None) -> int:
    sys.path.insert(0, str(HERE))
    from gpu_peer import ckptlab_methods

    from ckptlab.cli.report import int_list, writable_folder

    have = list(ckptlab_methods())
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--n", type=int_list, default=[256, 1024])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--impl", default=",".join(have), help=f"from {have}")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds for the ncu run")
    a = p.parse_args(argv)
    impls = [x for x in a.impl.split(",") if x]
    bad = [x for x in impls if x not in have]
    if bad:
        p.error(f"--impl: {bad} not among this checkout's methods {have}")
    out = writable_folder(a.out)  # before the ncu run: a bad folder is one line, status 2
    return profile(cases(a.n, impls, a.batch, a.heads, a.d), out, a.timeout)


if __name__ == "__main__":
    from ckptlab.args import exit_with  # one line for a write error; quiet into | head

    exit_with(main)
