"""Constants that C++ and Python share, read from the C++ header that defines them.

A number both sides need (a tile size, a fault code, a shared-memory limit, a Philox
multiplier) is written once, in a header, and Python reads it from there: nothing is copied by
hand, so nothing can drift. Two forms are understood, one per line:

    #define NAME 16            (an integer: decimal, hex, with an optional u/l suffix,
    #define NAME (48 * 1024)    or a product/sum of such integers in parentheses)
    enum Name { A = 1, B = 2 };  (every enumerator with an explicit value)

This module imports nothing of ckptlab: the emulator (the lowest layer) uses it too.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

_DEFINE = re.compile(r"^\s*#\s*define\s+([A-Za-z_]\w*)\s+([^/\n]+?)\s*(?://.*)?$", re.M)
_ENUM = re.compile(r"\benum\s+(?:class\s+)?(?:[A-Za-z_]\w*\s*)?(?::\s*\w+\s*)?\{([^}]*)\}", re.S)
_ENUMERATOR = re.compile(r"([A-Za-z_]\w*)\s*=\s*([^,]+)")
_INT = re.compile(r"(0[xX][0-9a-fA-F]+|\d+)[uUlL]*")
_SAFE = re.compile(r"^[\d\s()+*\-xXa-fA-F]+$")


def _strip_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/", " ", text, flags=re.S)


def _value(expr: str):
    """An integer constant expression of literals, + - * and parentheses, or None."""
    expr = _INT.sub(lambda m: str(int(m.group(1), 0)), expr.strip())
    if not expr or not _SAFE.match(expr):
        return None
    try:
        return int(eval(expr, {"__builtins__": {}}, {}))  # digits and + - * ( ) only
    except (SyntaxError, TypeError, ValueError, ZeroDivisionError):
        return None


@functools.lru_cache(maxsize=None)
def _read(path: str, mtime: float) -> dict:
    text = _strip_comments(Path(path).read_text())
    out = {}
    for name, expr in _DEFINE.findall(text):
        value = _value(expr)
        if value is not None:
            out[name] = value
    for body in _ENUM.findall(text):
        for name, expr in _ENUMERATOR.findall(re.sub(r"//[^\n]*", "", body)):
            value = _value(expr)
            if value is not None:
                out[name] = value
    return out


def read(path) -> dict:
    """{NAME: int} of every integer #define and explicit enumerator in the header at `path`."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no header {str(p)!r} to read constants from")
    return dict(_read(str(p.resolve()), p.stat().st_mtime))


def constant(path, name: str) -> int:
    """One integer constant of a header; a clear error if the header does not define it."""
    values = read(path)
    if name not in values:
        raise KeyError(f"{Path(path).name} defines no integer constant {name!r} (it defines "
                       f"{sorted(values)})")
    return values[name]
