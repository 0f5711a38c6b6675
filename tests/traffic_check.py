"""Helpers shared by the traffic tests: the emulator's record and the model, side by side in
the same shape, so a test compares them with one ==."""

import numpy as np


def inputs(B, H, Nq, Nk, d, dtype=np.float32, seed=0):
    """q, k, v, dO of standard normal values in `dtype`."""
    g = np.random.default_rng(seed)
    return tuple(g.standard_normal(s).astype(dtype)
                 for s in ((B, H, Nq, d), (B, H, Nk, d), (B, H, Nk, d), (B, H, Nq, d)))


def counted(rec) -> list:
    """[(kernel, {arg: (read, write, atomic ops, atomic bytes)})] as the emulator counted."""
    return [(x.kernel, {n: (a.read_bytes, a.write_bytes, a.atomic_ops, a.atomic_bytes)
                        for n, a in x.args.items()}) for x in rec.launches]


def modeled(launches) -> list:
    """The same from the model (4-byte atomics)."""
    return [(m.kernel, {n: (m.read[n], m.write[n], m.atomics[n], 4 * m.atomics[n])
                        for n in m.read}) for m in launches]


def counted_unique(rec) -> list:
    """[(kernel, {arg: (unique read, unique write)})] as the emulator counted."""
    return [(x.kernel, {n: (a.unique_read_bytes, a.unique_write_bytes)
                        for n, a in x.args.items()}) for x in rec.launches]


def modeled_unique(launches) -> list:
    """The emulator counts an atomicAdd's address as read and as written (a read-modify-write);
    the model keeps it apart (unique_atomic)."""
    return [(m.kernel, {n: (m.unique_read[n] + m.unique_atomic[n],
                            m.unique_write[n] + m.unique_atomic[n]) for n in m.read})
            for m in launches]
