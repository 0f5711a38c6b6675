"""A pool thread that a signal stopped inside the C library runs no more blocks, and ends: 200
faults in a row (glibc's own abort(), in every block of a launch on several workers) leave the
process with as many threads, as much address space and as many mappings as before, each fault
still an EmuError, and the next launch still runs on every worker. (Retired threads used to be
parked for good: 200 faults left 200 more threads and 1.6 GB of stacks.) In a subprocess, so
that a regression cannot leave its threads in the test run."""

import os
import subprocess
import sys
import textwrap

import pytest

FAULTS = 200
SCRIPT = r"""
import os
import numpy as np
from ckptlab import emu
src = r'''#include <cstdlib>
extern "C" __global__ void calls_abort(float* o) {
    if (threadIdx.x == 3) (abort)();  // glibc's own abort(), not the shim's macro
    o[blockIdx.x * blockDim.x + threadIdx.x] = 1.0f;
}
extern "C" __global__ void ok(float* o) { o[blockIdx.x * blockDim.x + threadIdx.x] = 2.0f; }
'''

def usage():
    vm = [int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmSize:")][0]
    maps = sum(1 for _ in open("/proc/self/maps"))
    return len(os.listdir("/proc/self/task")), vm // 1024, maps

mod = emu.RawModule(code=src, name="retire.cu")
fault, ok = mod.get_function("calls_abort"), mod.get_function("ok")
with emu.settings(mode=MODE, workers=3):
    o = np.zeros(3 * 8, np.float32)
    assert ok((3,), (8,), (o,)).workers == 3  # the pool is started
    before = usage()
    errors = 0
    for _ in range(FAULTS):
        try:
            fault((3,), (8,), (np.zeros(3 * 8, np.float32),))
        except emu.EmuError as e:
            if "abort" in str(e) and e.kind in ("signal", "trap"):
                errors += 1
            else:
                print("OTHER", e.kind, e)
    after = usage()
    o[:] = 0
    assert ok((3,), (8,), (o,)).workers == 3 and (o == 2).all()
print("RESULT", errors, *before, *after)
"""


@pytest.mark.parametrize("mode", ["fast", "counted"])
def test_200_faults_in_the_c_library_leave_the_thread_count_flat(mode):
    code = textwrap.dedent(SCRIPT).replace("MODE", repr(mode)).replace("FAULTS", str(FAULTS))
    proc = subprocess.run([sys.executable, "-c", code], env=dict(os.environ),
                          capture_output=True, text=True, timeout=300)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    errors, threads0, vm0, maps0, threads1, vm1, maps1 = map(int, lines[0].split()[1:])
    assert errors == FAULTS, proc.stdout[-3000:]  # every fault still reported, as an abort
    # flat: a retired thread may still be ending when counted (3 workers: at most 3 of them)
    assert threads1 <= threads0 + 3, (threads0, threads1)
    assert vm1 - vm0 < 64, (vm0, vm1)  # MiB of address space (a thread's stack is 8 MiB)
    assert maps1 - maps0 < 20, (maps0, maps1)
