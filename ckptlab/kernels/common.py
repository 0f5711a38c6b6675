"""What every launch wrapper shares: the saved-state ledger, argument checks, NaN-poisoned
outputs, ceil_div, and fresh random inputs.

A wrapper is thin and strict: it checks dtype, contiguity, shapes and sizes with a message that
says what was expected and what came, before anything is launched; casts scalars to the kernel's
C types (CuPy passes a Python float as a double); computes the grid with ceil_div; allocates
outputs, poisoned with NaN so an element a kernel forgets to write shows up; and returns them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from ckptlab import device, rng
from ckptlab.kernels.table import HEAD_DIMS, LANES, MAX_TILE, SHARED_LIMIT


@dataclass
class Saved:
    """What a forward keeps for its backward (the ledger), plus the options it ran with."""

    method: str  # "naive", "stored" or "flash"
    tensors: dict  # name -> array of the target
    causal: bool
    scale: float
    dropout_p: float
    seed: int
    offset: int
    shapes: tuple = field(default=())  # (B, H, Nq, Nk, d)

    @property
    def nbytes(self) -> int:
        """Bytes held for the backward: the sum over `tensors`."""
        return int(sum(t.nbytes for t in self.tensors.values()))


# ---- validation ---------------------------------------------------------------------------
def check_array(name: str, a, shape=None, dtype=np.float32) -> None:
    """An fp32 (or `dtype`), C-contiguous array of the target, of rank 4 (or of `shape`, when
    given)."""
    target = device.target()
    if isinstance(a, np.ma.MaskedArray):
        raise TypeError(f"{name} is a NumPy masked array: the kernels would ignore its mask; "
                        "pass np.ma.filled(x, value) (or x.data to drop the mask)")
    if not device.is_device_array(a):
        raise TypeError(f"{name} must be a {device.xp().__name__} array on the {target!r} "
                        f"target, got {type(a).__module__}.{type(a).__name__}")
    if dtype != np.float32 and a.dtype != dtype:
        raise TypeError(f"{name} must have dtype {np.dtype(dtype)}, got {a.dtype}")
    if dtype == np.float32 and a.dtype != np.float32:
        hint = (" (this kernel is fp32 only; float16 and bfloat16 run on tensor cores with "
                "method 'stored' or 'flash')" if a.dtype.itemsize == 2 and a.dtype.kind in "fV"
                else "")
        raise TypeError(f"{name} must have dtype float32, got {a.dtype}{hint}")
    rank = 4 if shape is None else len(shape)
    if a.ndim != rank:
        raise ValueError(f"{name} must have rank {rank}{' (B, H, N, d)' if shape is None else ''}"
                         f", got shape {tuple(a.shape)}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (the kernels ignore strides), got a "
                         "strided view: pass xp.ascontiguousarray(x)")
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(a.shape)}")


def check_qkv(q, k, v) -> tuple:
    for name, a in (("q", q), ("k", k), ("v", v)):
        check_array(name, a)
    B, H, Nq, d = q.shape
    if k.shape[:2] != (B, H) or k.shape[3] != d:
        raise ValueError(f"k must have shape (B, H, Nk, d) = ({B}, {H}, Nk, {d}) to match q "
                         f"{tuple(q.shape)}, got {tuple(k.shape)}")
    if v.shape != k.shape:
        raise ValueError(f"v must have the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    Nk = k.shape[2]
    if d not in HEAD_DIMS:
        raise ValueError(f"head dim d must be a multiple of {LANES} in [{LANES}, "
                         f"{HEAD_DIMS[-1]}], got d={d}")
    if min(B, H, Nq, Nk) < 1:
        raise ValueError(f"B, H, Nq and Nk must be >= 1, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}")
    if B * H > 65535:
        raise ValueError(f"B * H must be <= 65535 (one grid dimension), got {B * H}")
    return B, H, Nq, Nk, d


def check_options(causal, scale, dropout_p, seed, offset, d) -> tuple:
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    if isinstance(scale, (bool, np.bool_)) or \
            not isinstance(scale, (int, float, np.floating, np.integer)) or not np.isfinite(scale):
        raise ValueError(f"scale must be a finite number or None, got {scale!r}")
    fp32 = np.finfo(np.float32)
    if abs(float(scale)) > float(fp32.max):  # finite in float64, inf in the kernels' fp32
        raise ValueError(f"scale {scale!r} overflows float32 (the kernels compute in fp32, "
                         f"|scale| <= {float(fp32.max):.4g})")
    if scale != 0 and abs(float(scale)) < float(fp32.tiny):  # subnormal or 0 in fp32
        raise ValueError(f"scale {scale!r} is below float32's smallest normal "
                         f"{float(fp32.tiny):.4g}: the kernels' fp32 would hold a subnormal "
                         "(flushed to 0 where denormals are flushed) or 0")
    if not isinstance(dropout_p, (int, float, np.floating)) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p!r}")
    for name, x in (("seed", seed), ("offset", offset)):
        if not isinstance(x, (int, np.integer)) or not 0 <= int(x) < 2**64:
            raise ValueError(f"{name} must be an int in [0, 2**64), got {x!r}")
    return bool(causal), float(scale), float(dropout_p), int(seed), int(offset)


def check_tiles(tiles, d: int, shared_bytes, what: str) -> tuple:
    Br, Bc = tiles
    for name, t in (("Br", Br), ("Bc", Bc)):
        if not isinstance(t, (int, np.integer)) or t % LANES or not LANES <= t <= MAX_TILE:
            raise ValueError(f"{what} tile {name} must be a multiple of {LANES} in "
                             f"[{LANES}, {MAX_TILE}], got {t!r}")
    need = shared_bytes(d, Br, Bc)
    if need > SHARED_LIMIT:
        raise ValueError(f"{what} tiles (Br, Bc) = ({Br}, {Bc}) need {need} bytes of shared "
                         f"memory at d={d}; the static limit is {SHARED_LIMIT}: use smaller tiles")
    return int(Br), int(Bc)


def check_saved(saved, method: str, B, H, Nq, Nk, d, dtype=np.float32) -> None:
    """`saved` is what `method`'s forward returned for these shapes: every array the backward
    reads is there, of its shape, C-contiguous, of the target; O in the inputs' `dtype`
    (float16 / bfloat16 on the tensor-core path), L, S and P fp32. The one check for every
    method and dtype."""
    if not isinstance(saved, Saved) or saved.method != method:
        got = saved.method if isinstance(saved, Saved) else type(saved).__name__
        raise TypeError(f"saved must be what {method}_forward returned, got {got}")
    if saved.shapes != (B, H, Nq, Nk, d):
        raise ValueError(f"saved was made for (B, H, Nq, Nk, d) = {saved.shapes}, but q, k, v "
                         f"give {(B, H, Nq, Nk, d)}")
    # every array the backward reads, as the forward made it: a truncated L would be read out
    # of bounds on a GPU (or in the emulator's fast mode), before anything noticed
    need = {"P": (B, H, Nq, Nk)} if method == "naive" else {"O": (B, H, Nq, d), "L": (B, H, Nq)}
    if method == "stored":
        need["S"] = (B, H, Nq, Nk)
    if not isinstance(saved.tensors, dict) or set(saved.tensors) != set(need):
        got = sorted(saved.tensors) if isinstance(saved.tensors, dict) else saved.tensors
        raise ValueError(f"saved holds {got}; {method}_backward reads {sorted(need)}")
    for name, shape in need.items():
        check_array(f"saved {name}", saved.tensors[name], shape,
                    dtype if name == "O" else np.float32)
    check_options(saved.causal, saved.scale, saved.dropout_p, saved.seed, saved.offset, d)


def dropout_args(p: float, seed: int, offset: int) -> tuple:
    """(seed, offset, threshold, 1/(1-p)) with the kernels' C types."""
    return (np.uint64(seed), np.uint64(offset), np.uint32(rng.threshold(p)),
            np.float32(1.0 / (1.0 - p)))


_poison = True  # see unpoisoned()


@contextlib.contextmanager
def unpoisoned():
    """Inside the block, outputs are allocated uninitialised instead of NaN-filled: for timing
    on a GPU, where the fill (4 N^2 floats for the naive path) would be measured as kernel
    time. Tests and checks keep the poison, so an unwritten element cannot pass."""
    global _poison
    previous, _poison = _poison, False
    try:
        yield
    finally:
        _poison = previous


_fill = np.nan  # see poison_value()


@contextlib.contextmanager
def poison_value(value: float):
    """Inside the block, outputs are filled with `value` instead of NaN: run a launch twice,
    with NaN and with a value no kernel computes, and the elements still holding that value
    are the ones it never wrote (how the exercise checker tells "never written" from "computed
    NaN")."""
    global _fill
    previous, _fill = _fill, float(value)
    try:
        yield
    finally:
        _fill = previous


def still_poison(a) -> np.ndarray:
    """Elements of `a` (a NumPy array) that hold the poison outputs are filled with now: NaN, or
    the value of poison_value: what a kernel left unwritten, or a computed NaN where it is NaN."""
    a = np.asarray(a)
    return np.isnan(a) if np.isnan(_fill) else a == np.float32(_fill)


def poisoned(shape):
    """A new fp32 array of the target filled with NaN: an unwritten element can't pass."""
    xp = device.xp()
    return xp.full(shape, _fill, dtype=np.float32) if _poison else xp.empty(shape, np.float32)


def ceil_div(n: int, tile: int) -> int:
    return -(-n // tile)


def random_inputs(B, H, N, d, seed: int = 0, Nk: int | None = None):
    """q, k, v, dO: standard normal fp32 arrays of the current target, q and dO (B, H, N, d), k
    and v (B, H, Nk, d) (Nk defaults to N). Drawn on the GPU by CuPy there (fast at big sizes),
    by NumPy on the emulator: the same seed gives different numbers on the two targets."""
    Nk = N if Nk is None else Nk
    shapes = ((B, H, N, d), (B, H, Nk, d), (B, H, Nk, d), (B, H, N, d))
    if device.target() == "cuda":
        rs = device.xp("cuda").random.RandomState(seed)
        return tuple(rs.standard_normal(s, dtype=np.float32) for s in shapes)
    g = np.random.default_rng(seed)
    return tuple(g.standard_normal(s, dtype=np.float32) for s in shapes)
