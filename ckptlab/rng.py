"""Counter-based random numbers: Philox4x32-10 (Salmon et al., SC'11), vectorised in NumPy.

A counter-based RNG is a pure function of (key, counter): the same (seed, offset, index)
always gives the same number, in any order, on any device. That is what lets a backward pass
*regenerate* a dropout mask instead of storing it, and what kernels/philox.cuh computes on the
GPU bit for bit.

Layout used everywhere in ckptlab (kernels included):
    key     = (seed & 0xffffffff, seed >> 32)
    counter = (index & 0xffffffff, index >> 32, offset & 0xffffffff, offset >> 32)
and an element keeps its value iff (philox(...)[0] >> 8) >= threshold(p), where
threshold(p) = round(p * 2**24): an integer compare, so host and device agree exactly.
"""

from __future__ import annotations

import numpy as np

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)  # round multipliers
_W0, _W1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)  # Weyl key increments
_LO = np.uint64(0xFFFFFFFF)
ROUNDS = 10


def philox4x32(counter, key, rounds: int = ROUNDS):
    """Philox4x32 on arrays: counter is 4 uint32 arrays (broadcastable), key is 2 uint32 arrays.
    Returns the 4 output words as uint32 arrays."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint32) for c in counter)
    k0, k1 = (np.asarray(k, dtype=np.uint32) for k in key)
    with np.errstate(over="ignore"):
        for r in range(rounds):
            if r > 0:  # the key schedule: bump the key between rounds
                k0 = k0 + _W0
                k1 = k1 + _W1
            p0 = _M0 * c0.astype(np.uint64)  # 32x32 -> 64-bit products
            p1 = _M1 * c2.astype(np.uint64)
            hi0, lo0 = (p0 >> np.uint64(32)).astype(np.uint32), (p0 & _LO).astype(np.uint32)
            hi1, lo1 = (p1 >> np.uint64(32)).astype(np.uint32), (p1 & _LO).astype(np.uint32)
            c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def random_words(seed: int, offset: int, index) -> np.ndarray:
    """The first Philox output word for each element index (uint64 array-like) -> uint32."""
    index = np.asarray(index, dtype=np.uint64)
    seed, offset = int(seed), int(offset)
    if not (0 <= seed < 2**64 and 0 <= offset < 2**64):
        raise ValueError(f"seed and offset must be in [0, 2**64), got seed={seed}, offset={offset}")
    counter = (
        (index & _LO).astype(np.uint32),
        (index >> np.uint64(32)).astype(np.uint32),
        np.uint32(offset & 0xFFFFFFFF),
        np.uint32(offset >> 32),
    )
    key = (np.uint32(seed & 0xFFFFFFFF), np.uint32(seed >> 32))
    return philox4x32(counter, key)[0]


def threshold(p: float) -> int:
    """The integer keep-threshold of dropout probability p: keep iff (word >> 8) >= threshold."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability p must be in [0, 1), got {p}")
    return int(round(p * 2**24))


def keep_mask(seed: int, offset: int, shape, p: float) -> np.ndarray:
    """Dropout keep-mask (bool, `shape`) for elements numbered 0..prod(shape)-1 in C order."""
    t = threshold(p)
    index = np.arange(int(np.prod(shape)), dtype=np.uint64).reshape(shape)
    return (random_words(seed, offset, index) >> np.uint32(8)) >= np.uint32(t)
