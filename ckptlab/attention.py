"""Launch wrappers for the four attention kernels: validate, allocate, grid, launch, return.

    O, saved = naive_forward(q, k, v, causal=False, scale=None, dropout_p=0.0, seed=0, offset=0)
    dq, dk, dv = naive_backward(dO, q, k, v, saved)
    O, saved = flash_forward(q, k, v, causal=False, scale=None, dropout_p=0.0, seed=0, offset=0)
    dq, dk, dv = flash_backward(dO, q, k, v, saved, deterministic=False)

Arrays are fp32 (B, H, N, d), C-contiguous, of the current target (NumPy on "emu", CuPy on
"cuda"). `saved` is the ledger of what the forward keeps for the backward: naive keeps P
(B, H, Nq, Nk); flash keeps exactly O and L = m + log l (B, H, Nq). Every input is checked
before anything is launched; outputs are poisoned with NaN so an element a kernel forgets to
write shows up. The kernels and their math: kernels/attn_*.cu.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from ckptlab import device, rng

HEAD_DIMS = (16, 32, 64, 128)
LANES = 8  # threads per tile row in the flash kernels (kernels/common.cuh)
NAIVE_TILE = 16  # output tile of the naive matmuls (kernels/common.cuh)
SOFTMAX_ROWS = 4  # rows (one warp each) per block of the naive softmax and dS kernels
SHARED_LIMIT = 48 * 1024  # static shared memory a block may use without opting in
MAX_TILE = 1024 // LANES  # a block has Br * LANES (or Bc * LANES) threads, at most 1024

# default (Br, Bc) per head dim: power-of-two tiles whose shared memory stays within 48 KiB
# (with a block of Br * LANES threads, 512 at most, so 128 registers a thread still fit)
FWD_TILES = {16: (64, 32), 32: (64, 32), 64: (64, 32), 128: (32, 16)}
BWD_TILES = {16: (32, 32), 32: (32, 32), 64: (32, 32), 128: (16, 16)}


def flash_fwd_shared_bytes(d: int, Br: int, Bc: int) -> int:
    """Static shared memory of attn_flash_fwd<d, Br, Bc>: Qs, Ks (padded), Vs, Ps (padded)."""
    return 4 * (Br * (d + 1) + Bc * (d + 1) + Bc * d + Br * (Bc + 1))


def flash_bwd_shared_bytes(d: int, Br: int, Bc: int) -> int:
    """Static shared memory of attn_flash_bwd_dkdv<d, Br, Bc> (the larger of the two backward
    kernels): K, V, Q, dO tiles (padded), P and dS tiles (padded), L and D."""
    return 4 * (2 * Bc * (d + 1) + 2 * Br * (d + 1) + 2 * Br * (Bc + 1) + 2 * Br)


@dataclass
class Saved:
    """What a forward keeps for its backward (the ledger), plus the options it ran with."""

    method: str  # "naive" or "flash"
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


# ---- validation -----------------------------------------------------------------------------
def _check_array(name: str, a, shape=None) -> None:
    target = device.target()
    if not device.is_device_array(a):
        raise TypeError(f"{name} must be a {device.xp().__name__} array on the {target!r} "
                        f"target, got {type(a).__module__}.{type(a).__name__}")
    if a.dtype != np.float32:
        raise TypeError(f"{name} must have dtype float32, got {a.dtype}")
    if a.ndim != 4:
        raise ValueError(f"{name} must have rank 4 (B, H, N, d), got shape {tuple(a.shape)}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (the kernels ignore strides), got a "
                         "strided view: pass xp.ascontiguousarray(x)")
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(a.shape)}")


def _check_qkv(q, k, v) -> tuple:
    for name, a in (("q", q), ("k", k), ("v", v)):
        _check_array(name, a)
    B, H, Nq, d = q.shape
    if k.shape[:2] != (B, H) or k.shape[3] != d:
        raise ValueError(f"k must have shape (B, H, Nk, d) = ({B}, {H}, Nk, {d}) to match q "
                         f"{tuple(q.shape)}, got {tuple(k.shape)}")
    if v.shape != k.shape:
        raise ValueError(f"v must have the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    Nk = k.shape[2]
    if d not in HEAD_DIMS:
        raise ValueError(f"head dim d must be one of {HEAD_DIMS}, got d={d}")
    if min(B, H, Nq, Nk) < 1:
        raise ValueError(f"B, H, Nq and Nk must be >= 1, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}")
    if B * H > 65535:
        raise ValueError(f"B * H must be <= 65535 (one grid dimension), got {B * H}")
    return B, H, Nq, Nk, d


def _check_options(causal, scale, dropout_p, seed, offset, d) -> tuple:
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    if not isinstance(scale, (int, float, np.floating, np.integer)) or not np.isfinite(scale):
        raise ValueError(f"scale must be a finite number or None, got {scale!r}")
    if not isinstance(dropout_p, (int, float, np.floating)) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p!r}")
    for name, x in (("seed", seed), ("offset", offset)):
        if not isinstance(x, (int, np.integer)) or not 0 <= int(x) < 2**64:
            raise ValueError(f"{name} must be an int in [0, 2**64), got {x!r}")
    return bool(causal), float(scale), float(dropout_p), int(seed), int(offset)


def _check_tiles(tiles, d: int, shared_bytes, what: str) -> tuple:
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


def _check_saved(saved, method: str, B, H, Nq, Nk, d) -> None:
    if not isinstance(saved, Saved) or saved.method != method:
        got = saved.method if isinstance(saved, Saved) else type(saved).__name__
        raise TypeError(f"saved must be what {method}_forward returned, got {got}")
    if saved.shapes != (B, H, Nq, Nk, d):
        raise ValueError(f"saved was made for (B, H, Nq, Nk, d) = {saved.shapes}, but q, k, v "
                         f"give {(B, H, Nq, Nk, d)}")


def _dropout_args(p: float, seed: int, offset: int) -> tuple:
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


def _poisoned(shape):
    """A new fp32 array of the target filled with NaN: an unwritten element can't pass."""
    xp = device.xp()
    return xp.full(shape, np.nan, dtype=np.float32) if _poison else xp.empty(shape, np.float32)


def ceil_div(n: int, tile: int) -> int:
    return -(-n // tile)


# ---- naive ----------------------------------------------------------------------------------
def naive_forward(q, k, v, causal=False, scale=None, dropout_p=0.0, seed=0, offset=0):
    """Standard attention, three launches: S = scale Q K^T, P = softmax(S), O = dropout(P) V.
    S and P go through HBM; P (B, H, Nq, Nk) is kept for the backward."""
    B, H, Nq, Nk, d = _check_qkv(q, k, v)
    causal, scale, p, seed, offset = _check_options(causal, scale, dropout_p, seed, offset, d)
    S = _poisoned((B, H, Nq, Nk))  # (B, H, Nq, Nk), a temporary
    P = _poisoned((B, H, Nq, Nk))  # (B, H, Nq, Nk), saved
    O = _poisoned((B, H, Nq, d))  # (B, H, Nq, d)
    mod = device.load("attn_naive_fwd.cu")
    T, n = NAIVE_TILE, (np.int32(Nq), np.int32(Nk), np.int32(d))
    mod.get_function("attn_naive_scores")(
        (ceil_div(Nk, T), ceil_div(Nq, T), B * H), (T, T),
        (q, k, S, *n, np.float32(scale), np.int32(causal)))
    mod.get_function("attn_naive_softmax")(
        (ceil_div(Nq, SOFTMAX_ROWS), B * H), (32, SOFTMAX_ROWS), (S, P, n[0], n[1]))
    mod.get_function("attn_naive_pv")(
        (ceil_div(d, T), ceil_div(Nq, T), B * H), (T, T), (P, v, O, *n,
                                                            *_dropout_args(p, seed, offset)))
    saved = Saved("naive", {"P": P}, causal, scale, p, seed, offset, (B, H, Nq, Nk, d))
    return O, saved


def naive_backward(dO, q, k, v, saved):
    """The store-P backward, five launches: dV = P_d^T dO, dP = (dO V^T) Z/(1-p),
    dS = P (dP - D), dQ = scale dS K, dK = scale dS^T Q; dP and dS go through HBM."""
    B, H, Nq, Nk, d = _check_qkv(q, k, v)
    _check_array("dO", dO, (B, H, Nq, d))
    _check_saved(saved, "naive", B, H, Nq, Nk, d)
    P = saved.tensors["P"]
    dP = _poisoned((B, H, Nq, Nk))  # (B, H, Nq, Nk), a temporary
    dS = _poisoned((B, H, Nq, Nk))  # (B, H, Nq, Nk), a temporary
    dQ, dK, dV = _poisoned(q.shape), _poisoned(k.shape), _poisoned(v.shape)
    mod = device.load("attn_naive_bwd.cu")
    T, n = NAIVE_TILE, (np.int32(Nq), np.int32(Nk), np.int32(d))
    drop = _dropout_args(saved.dropout_p, saved.seed, saved.offset)
    scale = np.float32(saved.scale)
    mod.get_function("attn_naive_bwd_dv")(
        (ceil_div(d, T), ceil_div(Nk, T), B * H), (T, T), (P, dO, dV, *n, *drop))
    mod.get_function("attn_naive_bwd_dp")(
        (ceil_div(Nk, T), ceil_div(Nq, T), B * H), (T, T), (dO, v, dP, *n, *drop))
    mod.get_function("attn_naive_bwd_ds")(
        (ceil_div(Nq, SOFTMAX_ROWS), B * H), (32, SOFTMAX_ROWS), (P, dP, dS, n[0], n[1]))
    mod.get_function("attn_naive_bwd_dq")(
        (ceil_div(d, T), ceil_div(Nq, T), B * H), (T, T), (dS, k, dQ, *n, scale))
    mod.get_function("attn_naive_bwd_dk")(
        (ceil_div(d, T), ceil_div(Nk, T), B * H), (T, T), (dS, q, dK, *n, scale))
    return dQ, dK, dV


# ---- flash ----------------------------------------------------------------------------------
def template_name(name: str, *args) -> str:
    return f"{name}<{', '.join(str(a).lower() for a in args)}>"


def instantiations(filename: str) -> list[str]:
    """The template instantiations the wrappers launch by default from a kernel file (every
    head dim with its default tiles; for the backward both dQ modes): what CuPy/the emulator
    compile as name_expressions, and what `python -m ckptlab kernels` reports."""
    if filename == "attn_flash_fwd.cu":
        return [template_name("attn_flash_fwd", d, *FWD_TILES[d]) for d in HEAD_DIMS]
    if filename == "attn_flash_bwd.cu":
        dkdv = [template_name("attn_flash_bwd_dkdv", d, *BWD_TILES[d], atomic)
                for d in HEAD_DIMS for atomic in (True, False)]
        return dkdv + [template_name("attn_flash_bwd_dq", d, *BWD_TILES[d]) for d in HEAD_DIMS]
    return []


def _flash_module(filename: str, wanted: tuple, defaults: list):
    """Load a templated kernel file once with every default instantiation (one compile for all
    head dims), or with just the `wanted` ones when they are not defaults (custom tiles)."""
    names = tuple(defaults) if all(w in defaults for w in wanted) else tuple(wanted)
    return device.load(filename, name_expressions=names)


def flash_forward(q, k, v, causal=False, scale=None, dropout_p=0.0, seed=0, offset=0, *,
                  tiles=None):
    """FlashAttention forward, one launch: tiled online softmax; writes O and L only.
    `tiles` = (Br, Bc) overrides FWD_TILES[d] (multiples of 8, shared memory <= 48 KiB)."""
    B, H, Nq, Nk, d = _check_qkv(q, k, v)
    causal, scale, p, seed, offset = _check_options(causal, scale, dropout_p, seed, offset, d)
    Br, Bc = _check_tiles(tiles or FWD_TILES[d], d, flash_fwd_shared_bytes, "forward")
    O = _poisoned((B, H, Nq, d))  # (B, H, Nq, d)
    L = _poisoned((B, H, Nq))  # (B, H, Nq)
    name = template_name("attn_flash_fwd", d, Br, Bc)
    defaults = instantiations("attn_flash_fwd.cu")
    kernel = _flash_module("attn_flash_fwd.cu", (name,), defaults).get_function(name)
    kernel((ceil_div(Nq, Br), B * H), (LANES, Br),
           (q, k, v, O, L, np.int32(Nq), np.int32(Nk), np.float32(scale), np.int32(causal),
            *_dropout_args(p, seed, offset)))
    saved = Saved("flash", {"O": O, "L": L}, causal, scale, p, seed, offset, (B, H, Nq, Nk, d))
    return O, saved


def flash_backward(dO, q, k, v, saved, deterministic=False, *, tiles=None):
    """FlashAttention backward: D = rowsum(dO * O), then the K/V-outer, Q-inner loop that
    recomputes P = exp(S - L) per tile. dQ by atomicAdd (FA2), or with deterministic=True by
    a second kernel that loops over K/V tiles per Q tile (no atomics, bitwise reproducible).
    `tiles` = (Br, Bc) overrides BWD_TILES[d]."""
    B, H, Nq, Nk, d = _check_qkv(q, k, v)
    _check_array("dO", dO, (B, H, Nq, d))
    _check_saved(saved, "flash", B, H, Nq, Nk, d)
    if not isinstance(deterministic, (bool, np.bool_)):
        raise TypeError(f"deterministic must be a bool, got {deterministic!r}")
    Br, Bc = _check_tiles(tiles or BWD_TILES[d], d, flash_bwd_shared_bytes, "backward")
    if Br > Bc * LANES:  # attn_flash_bwd_dkdv loads L and D with one thread per query row
        raise ValueError(f"backward tiles (Br, Bc) = ({Br}, {Bc}): Br must be at most "
                         f"Bc * {LANES} = {Bc * LANES} (the dK/dV block has Bc * {LANES} threads)")
    O, L = saved.tensors["O"], saved.tensors["L"]
    D = _poisoned((B, H, Nq))  # (B, H, Nq): D_i = rowsum(dO_i * O_i), a temporary
    dQ, dK, dV = _poisoned(q.shape), _poisoned(k.shape), _poisoned(v.shape)
    atomic = not deterministic
    dkdv = template_name("attn_flash_bwd_dkdv", d, Br, Bc, atomic)
    dq = template_name("attn_flash_bwd_dq", d, Br, Bc)
    defaults = instantiations("attn_flash_bwd.cu")
    mod = _flash_module("attn_flash_bwd.cu", (dkdv, dq) if deterministic else (dkdv,), defaults)
    rows = B * H * Nq
    mod.get_function("attn_flash_bwd_preprocess")(
        (ceil_div(rows, SOFTMAX_ROWS),), (32, SOFTMAX_ROWS),
        (O, dO, D, dQ, np.int32(rows), np.int32(d), np.int32(atomic)))
    args = (np.int32(Nq), np.int32(Nk), np.float32(saved.scale), np.int32(saved.causal),
            *_dropout_args(saved.dropout_p, saved.seed, saved.offset))
    mod.get_function(dkdv)((ceil_div(Nk, Bc), B * H), (LANES, Bc),
                           (q, k, v, dO, L, D, dQ, dK, dV, *args))
    if deterministic:
        mod.get_function(dq)((ceil_div(Nq, Br), B * H), (LANES, Br),
                             (q, k, v, dO, L, D, dQ, *args))
    return dQ, dK, dV
