"""HBM bytes measured by Nsight Compute, and the labels every byte figure carries.

Every HBM byte figure in ckptlab carries its source (docs/design.md, "Measurement"):
    counted   the emulator's exact count of global-memory requests per kernel argument (no
              cache is modelled: an upper bound on DRAM traffic)
    unique    the distinct bytes each launch touches (the emulator's bitmaps): what an ideal
              cache would move, a lower bound; DRAM traffic lies between unique and counted
    measured  Nsight Compute's DRAM counters (dram__bytes_read.sum + dram__bytes_write.sum),
              on a GPU
    modeled   the analytic formulas of ckptlab.measure.traffic
They answer different questions and must never be mixed unlabelled.

ncu_command / measure_hbm_bytes / parse_ncu_csv: run a workload under `ncu` and read the two
DRAM counters per kernel launch.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

SOURCES = ("counted", "unique", "measured", "modeled")
NCU_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
REPO_ROOT = Path(__file__).resolve().parents[2]


def check_source(source: str) -> str:
    """Refuse a byte figure whose source is not one of SOURCES."""
    if source not in SOURCES:
        raise ValueError(f"source: expected one of {SOURCES}, got {source!r}")
    return source


def ncu_available() -> bool:
    """True when Nsight Compute's `ncu` is on the PATH."""
    return shutil.which("ncu") is not None


def ncu_command(python_code: str, *, kernel_regex: str = "attn_", python: str | None = None):
    """The argv that profiles `python -c python_code` under ncu: only kernels whose name
    matches `kernel_regex`, the two DRAM byte counters, CSV, units in plain bytes
    (--print-units base), and the clocks left as found (--clock-control none)."""
    if not isinstance(python_code, str) or not python_code.strip():
        raise ValueError(f"python_code: expected a non-empty string, got {python_code!r}")
    if not isinstance(kernel_regex, str) or not kernel_regex:
        raise ValueError(f"kernel_regex: expected a non-empty regex string, got {kernel_regex!r}")
    return [
        "ncu",
        "--metrics", ",".join(NCU_METRICS),
        "--csv",
        "--print-units", "base",
        "--clock-control", "none",
        "--kernel-name", f"regex:{kernel_regex}",
        python or sys.executable, "-c", python_code,
    ]


def measure_hbm_bytes(python_code: str, *, kernel_regex: str = "attn_", timeout_s: float = 600):
    """Run `python_code` in a subprocess under ncu and return parse_ncu_csv of what it printed:
    one row per profiled kernel launch, source "measured". The repository root is put on
    PYTHONPATH so the code can import ckptlab."""
    if not ncu_available():
        raise RuntimeError("measure_hbm_bytes: `ncu` (Nsight Compute) is not on the PATH")
    argv = ncu_command(python_code, kernel_regex=kernel_regex)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-8:]
        raise RuntimeError(f"ncu exited with {proc.returncode}:\n" + "\n".join(tail))
    return parse_ncu_csv(proc.stdout + "\n" + proc.stderr)


# ncu prints bytes with SI prefixes unless told --print-units base; binary ones accepted too.
_BYTE_UNITS = {
    "byte": 1, "bytes": 1, "b": 1,
    "kbyte": 1e3, "kb": 1e3, "mbyte": 1e6, "mb": 1e6,
    "gbyte": 1e9, "gb": 1e9, "tbyte": 1e12, "tb": 1e12,
    "kibyte": 1024, "kib": 1024, "mibyte": 1024**2, "mib": 1024**2,
    "gibyte": 1024**3, "gib": 1024**3,
}
_THOUSANDS = re.compile(r"^\d{1,3}(,\d{3})+(\.\d+)?$")  # 1,048,576 or 1,048,576.5
_DECIMAL_COMMA = re.compile(r"^\d+,\d+$")  # 33,55 (a comma-decimal locale)


def _number(text: str) -> float:
    """A value as ncu prints it: 1048576, 1,048,576 (thousands separators, as ncu writes them
    in English locales), 33.55, or 33,55 (a comma-decimal locale, when not three digits)."""
    t = text.strip()
    if _THOUSANDS.match(t):
        t = t.replace(",", "")
    elif _DECIMAL_COMMA.match(t):
        t = t.replace(",", ".")
    try:
        return float(t)
    except ValueError:
        raise ValueError(f"ncu value: expected a number, got {text!r}") from None


def _to_bytes(value: str, unit: str, metric: str) -> float:
    scale = _BYTE_UNITS.get(unit.strip().lower())
    if scale is None:
        raise ValueError(f"{metric}: unknown unit {unit!r}; expected one of {sorted(_BYTE_UNITS)}")
    return _number(value) * scale


def _find_header(lines: list[str]) -> tuple[int, list[str]]:
    """Index and fields of the table's header line; a clear error (with ncu's own ==ERROR== and
    ==WARNING== lines) when there is none, e.g. no kernel matched or counters were denied."""
    for i, line in enumerate(lines):
        fields = next(csv.reader([line])) if line.startswith('"') else []
        if "Kernel Name" in fields and ("Metric Name" in fields or NCU_METRICS[0] in fields):
            return i, fields
    notes = [ln.strip() for ln in lines if ln.startswith(("==ERROR==", "==WARNING=="))]
    raise ValueError(
        "parse_ncu_csv: no ncu CSV table found (expected a header with 'Kernel Name')"
        + ("; ncu said: " + " | ".join(notes) if notes else "")
    )


def parse_ncu_csv(text: str) -> list[dict]:
    """Per kernel launch, bytes read from and written to DRAM, from `ncu --csv` output.

    Reads both layouts ncu prints: the default (one row per metric: ..."Kernel Name",...,
    "Metric Name","Metric Unit","Metric Value") and --page raw (one row per launch, a column per
    metric, units in the row under the header). Lines that are not part of the table (==PROF==
    notices, the program's own output) are skipped. Returns dicts with kernel, launch_id,
    bytes_read, bytes_written, bytes_total and source="measured", ordered by launch id."""
    if not isinstance(text, str):
        raise TypeError(f"text: expected the str ncu printed, got {type(text).__name__}")
    lines = text.splitlines()
    start, header = _find_header(lines)
    rows = [r for r in csv.reader(lines[start + 1 :]) if len(r) == len(header)]
    col = {name: k for k, name in enumerate(header)}
    launches: dict = {}  # launch id -> {"kernel": ..., metric: bytes}
    if "Metric Name" in col:
        for r in rows:
            metric = r[col["Metric Name"]]
            if metric in NCU_METRICS:
                launch = launches.setdefault(r[col["ID"]], {"kernel": r[col["Kernel Name"]]})
                launch[metric] = _to_bytes(r[col["Metric Value"]], r[col["Metric Unit"]], metric)
    elif rows:
        units, data = rows[0], rows[1:]  # --page raw: the row under the header holds the units
        for r in data:
            launch = launches.setdefault(r[col["ID"]], {"kernel": r[col["Kernel Name"]]})
            for metric in NCU_METRICS:
                if metric in col:
                    launch[metric] = _to_bytes(r[col[metric]], units[col[metric]], metric)
    out = []
    for launch_id, m in launches.items():
        missing = [name for name in NCU_METRICS if name not in m]
        if missing:
            raise ValueError(f"parse_ncu_csv: launch {launch_id} ({m['kernel']}) lacks {missing}")
        read, written = m[NCU_METRICS[0]], m[NCU_METRICS[1]]
        out.append({
            "kernel": m["kernel"], "launch_id": int(_number(launch_id)),
            "bytes_read": read, "bytes_written": written, "bytes_total": read + written,
            "source": "measured",
        })
    return sorted(out, key=lambda d: d["launch_id"])
