"""The emulator runtime's own threads under ThreadSanitizer: the runtime (not the kernels) is
built once with GCC's -fsanitize=thread, loaded into a Python that preloads libtsan, and a counted
launch on 3 workers (blocks claimed from one counter, unique-byte bitmaps shared by the workers,
atomics, the race check, then the access trace's slots claimed from one counter) runs under it.
The real runtime gives no report; a runtime with the block claim, the bitmap's OR or the trace's
slot claim made non-atomic gives a data race naming that line: a race between workers is found
by a tool, not by luck (2 million block claims on 2 cores never showed either). Slow: the
runtime is compiled four times with the sanitizer.

How: the counting hooks memory.cpp and atomics.cpp define are named as TSan's own entry points
(__tsan_read4, ...), which GCC calls from the kernel's code. In this build they are renamed
(-D__tsan_X=emu_hook_X) and so are the kernel object's calls to them (objcopy --redefine-sym):
the kernel's accesses reach the emulator's hooks, and the runtime's own instrumented accesses
reach libtsan.
Only the runtime's stacks are switched between fibers, which TSan does not see: the runtime is
built without function entry/exit hooks (no shadow call stack to confuse), and the workload has
no faults (a siglongjmp across fibers would)."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ckptlab.emu import build

pytestmark = pytest.mark.slow
EMU = Path(build.__file__).resolve().parent

WORKLOAD = r"""
import os, re, subprocess, sys
from pathlib import Path
import numpy as np
from ckptlab import emu
from ckptlab.emu import build

src = Path(sys.argv[1])  # a copy of ckptlab/emu's runtime, perhaps with a race planted
build.HERE = src
build.RUNTIME = [src / p.name for p in build.RUNTIME]
cxx = build.compiler()
names = ""
for hooks in ("memory.cpp", "atomics.cpp"):  # the files that define the hooks GCC calls
    obj = Path(os.environ["CKPTLAB_CACHE_DIR"]) / f"{hooks}-names.o"
    subprocess.run([cxx, *build.BASE_FLAGS, "-I", str(src), "-c", str(src / hooks), "-o",
                    str(obj)], check=True)
    names += subprocess.run(["nm", "--defined-only", str(obj)], capture_output=True, text=True,
                            check=True).stdout
rename = {h: "emu_hook" + h[len("__tsan"):] for h in set(re.findall(r"\b(__tsan_\w+)", names))}
assert "__tsan_read4" in rename and "__tsan_atomic32_fetch_add" in rename, sorted(rename)
build.RUNTIME_FLAGS = build.RUNTIME_FLAGS + [
    "-fsanitize=thread", "--param", "tsan-instrument-func-entry-exit=0",
    *[f"-D{a}={b}" for a, b in rename.items()]]
plain_run = build._run

def run(cmd, what):
    if "-shared" in cmd:
        cmd = cmd + ["-fsanitize=thread"]  # the runtime calls into libtsan
    plain_run(cmd, what)
    if "-include" in cmd and "-c" in cmd and "-fsanitize=thread" in cmd:  # the kernel's object
        plain_run(["objcopy", *[f"--redefine-sym={a}={b}" for a, b in rename.items()],
                   cmd[cmd.index("-o") + 1]], "renaming the kernel's calls to the hooks")

build._run = run
SRC = r'''
extern "C" __global__ void scatter(const int* in, int* out, unsigned* bins, int n) {
    const int i = threadIdx.x * gridDim.x + blockIdx.x;  // neighbours are in other blocks
    if (i < n) {
        out[i] = in[i] + 1;
        atomicAdd(&bins[in[i] & 7], 1u);
    }
}
'''
fn = emu.RawModule(code=SRC, name="tsan.cu").get_function("scatter")
n = 512 * 64
x = np.arange(n, dtype=np.int32)
with emu.settings(mode="counted", race_check=True, workers=3, block_order="serial"):
    right = True  # (a planted race may lose a bitmap's bits: counted, not asserted, here)
    for _ in range(12):  # fresh bitmaps each launch: their first touches race again
        out, bins = np.zeros(n, np.int32), np.zeros(8, np.uint32)
        launch = fn((512,), (64,), (x, out, bins, np.int32(n)))
        right &= launch.workers == 3 and launch.blocks == 512 and np.array_equal(out, x + 1)
        right &= bins.tolist() == [n // 8] * 8
        right &= launch.args["out"].unique_write_bytes == 4 * n
    out, bins = np.zeros(n, np.int32), np.zeros(8, np.uint32)
    with emu.trace() as tr:  # the access trace: workers claim its slots with one counter
        launch = fn((512,), (64,), (x, out, bins, np.int32(n)))
    t = tr.last
    right &= launch.workers == 3 and not t.truncated and len(t.events) == t.total_events
    right &= (t["out"].count("write", by="access") == 1).all()
    right &= t["bins"].count("atomic", by="access").tolist() == [n // 8] * 8
print("WORKLOAD DONE", "right" if right else "wrong")
"""

PLANTED = {
    "real": None,
    "claim": ("workers.cpp", "__atomic_fetch_add(&g_next.value, 1, __ATOMIC_RELAXED)",
              "g_next.value++"),
    "bitmap": ("memory.cpp", "__atomic_fetch_or(&bits[w], m, __ATOMIC_RELAXED)",
               "(bits[w] |= m)"),
    "trace": ("trace.cpp", "__atomic_fetch_add(&g_trace_next, pieces, __ATOMIC_RELAXED)",
              "(g_trace_next += pieces) - pieces"),
}


def libtsan() -> str:
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    if not cxx or not shutil.which("objcopy") or not shutil.which("nm"):
        pytest.skip("needs g++, objcopy and nm (binutils)")
    path = subprocess.run([cxx, "-print-file-name=libtsan.so"], capture_output=True,
                          text=True).stdout.strip()
    if not os.path.isabs(path) or not os.path.exists(path):
        pytest.skip(f"GCC's ThreadSanitizer runtime (libtsan) is not installed ({cxx})")
    return path


def under_tsan(tmp_path: Path, which: str) -> subprocess.CompletedProcess:
    src = tmp_path / which
    src.mkdir()
    for f in EMU.iterdir():
        if f.suffix in (".cpp", ".h", ".py"):
            shutil.copy(f, src / f.name)
    if PLANTED[which]:
        name, old, new = PLANTED[which]
        text = (src / name).read_text()
        assert text.count(old) == 1, (name, old)  # the planted race still has its place
        (src / name).write_text(text.replace(old, new))
    cache = tmp_path / f"cache-{which}"
    cache.mkdir(mode=0o700)
    env = dict(os.environ, LD_PRELOAD=libtsan(), CKPTLAB_CACHE_DIR=str(cache),
               TSAN_OPTIONS="halt_on_error=0 report_signal_unsafe=0",
               PYTHONPATH=str(EMU.parent.parent))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(WORKLOAD), str(src)], env=env,
                          capture_output=True, text=True, timeout=900)
    if "FATAL: ThreadSanitizer" in proc.stderr:  # e.g. a memory layout this TSan cannot use
        pytest.skip("ThreadSanitizer cannot run here: " + proc.stderr.strip().splitlines()[0])
    assert "WORKLOAD DONE" in proc.stdout, proc.stderr[-4000:]
    return proc


def races(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines()
            if line.startswith("SUMMARY: ThreadSanitizer: data race")]


def test_the_runtime_has_no_data_race_between_workers(tmp_path):
    proc = under_tsan(tmp_path, "real")
    assert "ThreadSanitizer" not in proc.stderr, proc.stderr[-6000:]
    assert "WORKLOAD DONE right" in proc.stdout  # outputs, atomics and unique bytes


@pytest.mark.parametrize("which, where", [("claim", "workers.cpp"), ("bitmap", "memory.cpp"),
                                         ("trace", "trace.cpp")])
def test_a_planted_race_between_workers_is_found(tmp_path, which, where):
    found = races(under_tsan(tmp_path, which))
    assert found and all(where in line for line in found), found
