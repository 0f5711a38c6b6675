"""What ptxas prints, read: its `-v` report (nvcc's or NVRTC's, any CUDA version) as one record
per function (registers, static shared memory, spills, stack, barriers, constant banks), and the
names those records go by.

    parse_ptxas_log   the records of one report, fields read by name
    extern_c_kernels  the extern "C" kernels a .cu source defines: each must be in its report
    short_name        a demangled signature cut to the kernel's name and template arguments
    demangle          C++ names for mangled (template) symbols, through cu++filt or c++filt

No compiler runs here (demangle runs only the name filter, where one is on the PATH):
ckptlab.kernels.nvrtc compiles and hands its logs over; tests/test_compile.py holds the parser
to the reports of several CUDA versions.
"""

from __future__ import annotations

import re
import shutil
import subprocess

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_USED = re.compile(r"Used (\d+) registers")
_FIELDS = {  # the pieces of a "Used ..." or stack line; their order and presence vary by version
    "barriers": re.compile(r"used (\d+) barriers"),
    "smem": re.compile(r"(\d+) bytes smem"),
    "lmem": re.compile(r"(\d+) bytes lmem"),
    "stack": re.compile(r"(\d+) bytes stack frame"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
    "cumulative_stack": re.compile(r"(\d+) bytes cumulative stack size"),
}
_CMEM = re.compile(r"(\d+) bytes cmem\[(\d+)\]")


_UNREAD = {"registers": None, "barriers": None, "smem": 0, "lmem": 0, "stack": None}
_UNREAD |= {"spill_stores": None, "spill_loads": None, "cumulative_stack": None}


def _new_record(symbol, kind, arch):
    return {"symbol": symbol, "kind": kind, "arch": arch, **_UNREAD, "cmem": {}}


def parse_ptxas_log(log: str, arch: str | None = None) -> list[dict]:
    """One record per function in a `ptxas -v` report, nvcc's or NVRTC's, any CUDA version.

    "Compiling entry function 'k' for 'sm_90'" opens a kernel; "Function properties for f"
    names the function the next stack/spill line belongs to (a kernel, or a __noinline__ device
    function: kind "device", no registers); "Used N registers, used B barriers, S bytes smem,
    C bytes cmem[0]" closes the kernel. Fields are read by name, as versions differ in which they
    print and in what order; one not printed stays None (barriers, in old versions). smem and
    lmem default to 0, as ptxas omits them when 0. A function printed twice is kept once.
    """
    if not isinstance(log, str):
        raise TypeError(f"log: expected the compiler's output as str, got {type(log).__name__}")
    records: dict[str, dict] = {}
    entry = current = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry = current = records[m[1]] = _new_record(m[1], "kernel", m[2])
        elif m := _PROPS.search(line):
            current = records.get(m[1])
            if current is None:  # a device function ptxas kept out of line
                where = entry["arch"] if entry is not None else arch
                current = records[m[1]] = _new_record(m[1], "device", where)
        elif (m := _USED.search(line)) and entry is not None:
            entry["registers"] = int(m[1])
            entry["cmem"] = {int(bank): int(n) for n, bank in _CMEM.findall(line)}
            _read_fields(entry, line)
        elif "bytes stack frame" in line and current is not None:
            _read_fields(current, line)
    return list(records.values())


def _read_fields(record, line):
    for key, pattern in _FIELDS.items():
        if m := pattern.search(line):
            record[key] = int(m[1])


def extern_c_kernels(source: str) -> list[str]:
    """Names of the `extern "C" __global__` kernels a .cu source defines (comments ignored):
    each of them must appear in the compiler's report."""
    source = re.sub(r"//[^\n]*|/\*.*?\*/", " ", source, flags=re.S)
    bounds = r"(?:__launch_bounds__\s*\([^)]*\)\s*)?"
    pattern = rf'extern\s+"C"\s+__global__\s+{bounds}void\s+{bounds}(\w+)\s*\('
    return re.findall(pattern, source)


def short_name(name: str) -> str:
    """'void attn_flash_fwd<64, 64, 32>(float const*, ...)' -> 'attn_flash_fwd<64, 64, 32>'."""
    name = re.sub(r"^void\s+", "", name)
    if name.endswith(")"):
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                return name[:i]
    return name


def demangle(symbols):
    """C++ names for mangled symbols (templates), through cu++filt or c++filt when present;
    extern "C" names and everything else come back unchanged."""
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if tool is None or not any(s.startswith("_Z") for s in symbols):
        return list(symbols)
    out = subprocess.run([tool], input="\n".join(symbols), capture_output=True, text=True)
    names = out.stdout.splitlines()
    return names if out.returncode == 0 and len(names) == len(symbols) else list(symbols)
