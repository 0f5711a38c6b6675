"""What every command shares: writing rows as CSV, formatting bytes and times, reading lists from
the command line, and refusing sizes that do not fit in memory (TooBig) before any work."""

from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile
from pathlib import Path

from ckptlab import device
from ckptlab.args import (  # noqa: F401  (the commands import them from here)
    UsageError,
    nonnegative_int,
    positive_float,
    positive_int,
)

BYTES = 4  # fp32


class TooBig(ValueError):
    """A requested size would not fit in the memory that is free (or in the launch grid); the
    message says by how much."""


# ---------------------------------------------------------------- CSV


def write_csv(rows: list[dict], path) -> None:
    """All rows as CSV (the union of their keys, in first-seen order); path '-' is stdout. A
    failed write (a full disk) raises the OSError with the path in it."""
    fields = list(dict.fromkeys(k for r in rows for k in r))
    if str(path) == "-":
        _write_rows(sys.stdout, fields, rows)
        return
    try:
        with open(path, "w", newline="") as out:
            _write_rows(out, fields, rows)
    except OSError as e:
        e.filename = e.filename or str(path)
        raise


def _write_rows(out, fields, rows) -> None:
    w = csv.DictWriter(out, fieldnames=fields)
    w.writeheader()
    w.writerows(rows)


def _can_create_in(folder: Path) -> str | None:
    """None if a file can be created in `folder` (tried: a temporary file, removed at once;
    os.access alone says yes to root everywhere, /proc included), else the reason."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return None
    except OSError as e:
        return e.strerror or str(e)


def writable_file(path) -> Path:
    """Refuse, before any work, an output file whose folder is missing or not writable, a path
    that is a folder, or an empty name. '-' (stdout) is fine; so is an existing file or device
    that can be written (/dev/null; /dev/full passes here and fails at the write)."""
    if str(path) == "-":
        return Path("-")
    if not str(path):
        raise UsageError("expected a file name, got ''")
    p = Path(path)
    try:
        if p.is_dir():
            raise UsageError(f"{path}: is a folder; expected a file name")
        parent = p.parent if str(p.parent) else Path(".")
        if not parent.is_dir():
            raise UsageError(f"{path}: the folder {str(parent)!r} does not exist")
        if p.exists():
            if not os.access(p, os.W_OK):
                raise UsageError(f"{path}: not writable")
        elif (why := _can_create_in(parent)) is not None:
            raise UsageError(f"{path}: cannot create it ({why})")
    except OSError as e:  # a name too long, a loop of links...
        raise UsageError(f"{path}: {e.strerror or e}") from None
    return p


def writable_folder(path, option: str = "--out") -> Path:
    """Create the output folder if needed; refuse (before any work) a path that is a file, is
    empty or cannot be written. `option` names it in the message."""
    if not str(path):
        raise UsageError(f"{option}: expected a folder name, got ''")
    p = Path(path)
    try:
        if p.exists() and not p.is_dir():
            raise UsageError(f"{option} {path}: exists and is not a folder")
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{option} {path}: cannot create it ({e.strerror or e})") from None
    why = "no write permission" if not os.access(p, os.W_OK) else _can_create_in(p)
    if why is not None:
        raise UsageError(f"{option} {path}: not writable ({why})")
    return p


# ---------------------------------------------------------------- formatting


def fmt_bytes(x) -> str:
    """Binary units, as the figures use (1 MiB = 2^20 bytes); bandwidths stay decimal (GB/s)."""
    for scale, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if x >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.0f} B"


def fmt_seconds(x) -> str:
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if x >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x / 1e-9:.3g} ns"


# ---------------------------------------------------------------- argument types


def int_list(text: str) -> list[int]:
    """'64,128' -> [64, 128]; argparse type for --n."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


# ---------------------------------------------------------------- memory that is free


def free_bytes(target: str) -> tuple[int, str]:
    """(bytes free, where): the GPU's free memory plus what CuPy's pool holds unused, or the
    host's available RAM (os.sysconf)."""
    if target == "cuda":
        cp = device.xp("cuda")
        free, _ = cp.cuda.runtime.memGetInfo()
        return int(free + cp.get_default_memory_pool().free_bytes()), "free GPU memory"
    pages, size = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    return int(pages * size), "available host RAM"


def attention_bytes(method: str, B, H, N, d) -> int:
    """Peak bytes one attention forward + backward allocates: q, k, v, dO, O, dQ, dK, dV
    (8 x (B, H, N, d)); naive adds three N x N matrices at once (P, dP, dS in the backward;
    S, P in the forward), flash adds L and D (B, H, N), stored L, D and its N x N scores S."""
    bhnd = B * H * N * d * BYTES
    if method == "naive":
        return 8 * bhnd + 3 * B * H * N * N * BYTES
    scores = B * H * N * N * BYTES if method == "stored" else 0
    return 8 * bhnd + 2 * B * H * N * BYTES + scores


def check_bytes(need: int, what: str, target: str | None = None, headroom: float = 0.8,
                hint: str = "choose smaller sizes") -> int:
    """Raise TooBig (one line) if `need` bytes exceed `headroom` of the free memory."""
    have, where = free_bytes(target or device.target())
    if need > headroom * have:
        raise TooBig(f"{what} needs ~{need / 1e9:.2f} GB but only {have / 1e9:.2f} GB of {where} "
                     f"is free (using at most {headroom:.0%}): {hint}")
    return need


def check_fits(method: str, B, H, N, d, target: str | None = None,
               headroom: float = 0.8) -> int:
    """Raise TooBig (one line) if attention_bytes exceeds `headroom` of the free memory, or if
    B * H exceeds the grid dimension the kernels put it on (CUDA's 65535 for y and z)."""
    from ckptlab.emu.abi import GRID_LIMITS  # here: importing the emulator reads CKPTLAB_EMU_*,
    # which main() checks first, to refuse a bad value in one line

    if B * H > GRID_LIMITS[1]:
        raise TooBig(f"{method} attention at B={B} H={H}: B * H = {B * H} is over the "
                     f"{GRID_LIMITS[1]} blocks of one grid dimension: choose a smaller B or H")
    return check_bytes(attention_bytes(method, B, H, N, d),
                       f"{method} attention at B={B} H={H} N={N} d={d}", target, headroom,
                       "choose a smaller N, B or H")
