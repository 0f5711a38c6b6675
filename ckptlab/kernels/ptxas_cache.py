"""NVIDIA's compiler reports (ptxas records), kept on disk in the emulator's cache folder
(ptxas-records/) under a hash of everything a record depends on: the .cu file and every header
beside it, the arch, the compiler and its version, the options, the instantiations and the
defines. A changed source, header or compiler compiles again; a failed compile is never kept;
a corrupt record is compiled again (tests/test_ptxas_cache.py holds all of it)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ckptlab.emu.cache import cache_dir


def path_for(path: Path, arch: str, label: str, names, defines, include_dirs) -> Path:
    h = hashlib.sha256()
    for f in [path, *sorted(p for p in path.resolve().parent.iterdir()
                            if p.suffix in (".cuh", ".h") and p.is_file())]:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    h.update(repr((arch, label, list(names), sorted(dict(defines or {}).items()),
                   tuple(include_dirs))).encode())
    return cache_dir() / "ptxas-records" / f"{path.name}-{arch}-{h.hexdigest()[:20]}.json"


# what every record carries (nvrtc.compile_records) and the readers of records use
RECORD_KEYS = ("file", "kernel", "kind", "arch", "backend", "registers", "smem", "stack",
               "spill_stores", "spill_loads", "barriers")


def load(kept: Path) -> list | None:
    """The records kept at `kept`, or None: none kept, or not records (unreadable, not JSON, or
    JSON of another shape: a corrupt file is compiled again and replaced, never trusted)."""
    try:
        records = json.loads(kept.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(records, list) or not all(
            isinstance(r, dict) and all(k in r for k in RECORD_KEYS) for r in records):
        return None
    return records


def store(kept: Path, records: list) -> None:
    kept.parent.mkdir(parents=True, exist_ok=True)
    tmp = kept.with_name(f".{kept.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(records))
    os.replace(tmp, kept)  # whole or not at all, for a concurrent reader
