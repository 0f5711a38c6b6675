"""The learner's files, kept safe: a picture is written only over a picture ckptlab drew, in the
format its name says; a reset keeps every earlier version, numbered; a file is read whatever
its encoding, so that every command can say what state it is in.

A picture ckptlab draws carries the text MARK in its metadata (a PNG text chunk, the PDF's
Creator, the SVG's dc:creator): a file of that name holding it, in the format its suffix says,
may be drawn over; any other file is refused, as is a name whose suffix is not .png, .pdf or
.svg (the format follows the suffix).
"""

from __future__ import annotations

import re
from pathlib import Path

MARK = "ckptlab exercise picture"
FORMATS = {".png": ("png", "Software", b"\x89PNG\r\n\x1a\n"),
           ".pdf": ("pdf", "Creator", b"%PDF-"),
           ".svg": ("svg", "Creator", b"<?xml")}
BIGGEST_PICTURE = 64 << 20  # a file larger than this is not one of ours


def picture_format(path) -> str:
    """The matplotlib format `path` is written in ("png", "pdf" or "svg", from its suffix);
    ValueError, in one line, for another suffix or a file there that ckptlab did not draw."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(f"{path}: a picture is written as PNG, PDF or SVG, as its name ends "
                         f"(.png, .pdf, .svg), not {suffix or 'a name without a suffix'!r}")
    if p.exists() and not ours(p):
        raise ValueError(f"{path}: exists and is not a picture ckptlab drew; it is left as it "
                         "is (name another file, or move this one)")
    return FORMATS[suffix][0]


def ours(path: Path) -> bool:
    """True if `path` is a picture ckptlab drew: the magic bytes of its suffix's format, and
    MARK in it (what save_picture writes)."""
    try:
        if not path.is_file() or path.stat().st_size > BIGGEST_PICTURE:
            return False
        data = path.read_bytes()
    except OSError:
        return False
    magic = FORMATS.get(path.suffix.lower(), (None, None, None))[2]
    return magic is not None and data.startswith(magic) and MARK.encode() in data


def save_picture(fig, path) -> None:
    """Write the matplotlib Figure `fig` to `path`, in the format of its suffix, marked as
    ckptlab's (checked again just before: the file may have appeared since)."""
    fmt = picture_format(path)
    key = FORMATS[Path(path).suffix.lower()][1]
    fig.savefig(path, format=fmt, dpi=150, metadata={key: MARK})


def backups(path: Path) -> list[Path]:
    """The copies backup() made of `path`, oldest first (<name>.bak1, .bak2, ...)."""
    pattern = re.compile(re.escape(path.name) + r"\.bak(\d+)$")
    found = [(int(m[1]), q) for q in path.parent.iterdir() if (m := pattern.match(q.name))]
    return [q for _, q in sorted(found)]


def backup(path: Path) -> Path:
    """Copy `path`, byte for byte, to the first free <name>.bak<N> beside it, N one more than
    the largest already there (so the numbers go in the order the copies were made); never
    over an existing file. Returns the copy's path."""
    data = path.read_bytes()
    taken = backups(path)
    n = int(taken[-1].name.rsplit(".bak", 1)[1]) + 1 if taken else 1
    while True:
        copy = path.with_name(f"{path.name}.bak{n}")
        try:
            with open(copy, "xb") as out:  # "x": fails if it exists, never overwrites
                out.write(data)
            return copy
        except FileExistsError:
            n += 1


def decode(data: bytes) -> str:
    """The text of a source file: UTF-8 with any byte-order mark dropped (g++ and Python accept
    one; the checks compare without it). UnicodeDecodeError if it is not UTF-8."""
    return data.decode("utf-8-sig")


def text_anyway(path: Path) -> str:
    """The file's text, undecodable bytes as U+FFFD: enough to compare with the file as
    shipped (which is UTF-8), whatever the learner's editor saved."""
    return path.read_bytes().decode("utf-8-sig", errors="replace")


def line_of(data: bytes, offset: int) -> int:
    """The 1-based line of byte `offset` of `data`."""
    return data.count(b"\n", 0, offset) + 1
