"""Hints for a pattern in one exercise where the generic one (hints.GENERIC) would point at the
wrong place: in the wmma tile, an element never written, a NaN, an access past a tile or a race
between lanes comes from a fragment load or store's leading dimension, never from attention's
row and key guards; in an online softmax, NaN or an output of 0 everywhere comes from the first
update, while the running max is still -inf. An exercise's own hints (spec.Exercise.hints) come
before these, these before the generic ones.
"""

from __future__ import annotations

_TILE = (
    "Part of C is wrong, or never reached it. Which elements of the shared tiles does each "
    "fragment load or store touch, with the leading dimension you gave it?",
    "Steps 1 and 3: each wmma load and store walks its tile row by row, row r at pointer + r * "
    "(leading dimension): give each call the row length of the tile it reads or writes (As, Bs, "
    "Cs), so that it covers the whole tile and nothing past it.")

_FIRST_UPDATE = (
    "NaN or 0 comes out everywhere. On the first value a row (or lane) sees, its running max is "
    "still -inf: what does each of your exp() give then, and what is 0 * inf?",
    "A rescale factor is exp(old max - new max), at most 1, and 0 while nothing was summed; "
    "every exponent is a value minus the current max, so never positive; where the max is "
    "still -inf, 0 stands in for it.")

CLASS_HINTS = {
    "wmma_tile": {
        **{key: _TILE for key in ("unwritten", "nan", "part", "access", "tail")},
        "race": (
            "Two lanes wrote the same element of a shared tile in one wmma call. With the "
            "leading dimension you gave it, do the rows of the tile overlap?",
            "store_matrix_sync writes row r of the 16 x 16 accumulator at pointer + r * (leading "
            "dimension): anything less than the row length of Cs makes rows overlap (two lanes, "
            "one element) and leaves the end of Cs unwritten."),
    },
    **{name: {"nan": _FIRST_UPDATE, "zero": _FIRST_UPDATE}
       for name in ("flash_forward", "row_softmax", "naive_softmax")},
}


def hints_of(ex) -> dict:
    """The hints the check looks up for exercise `ex`: its own, then this module's."""
    return {**CLASS_HINTS.get(ex.name, {}), **ex.hints}
