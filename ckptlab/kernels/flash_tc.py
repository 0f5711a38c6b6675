"""Launch wrappers for the tensor-core attention pair (kernels/attn_flash_fwd_tc.cu, _bwd_tc.cu):
float16 or bfloat16 storage, wmma matmuls with fp32 accumulators, fp32 L and D.

    O, saved = tc_forward("flash", q, k, v, causal=False, scale=None, dropout_p=0.0, seed=0,
                          offset=0)                                     # or "stored"
    dq, dk, dv = tc_backward(dO, q, k, v, saved, deterministic=False)

q, k, v, dO: (B, H, N, d) arrays of one 16-bit dtype, C-contiguous, of the current target:
float16, or bfloat16 (ml_dtypes.bfloat16, NumPy's standard bfloat16; on a GPU a CuPy array of
that dtype, handed to the kernels as a 16-bit buffer). d any multiple of 8 up to 256. O and the
gradients come back in the inputs' dtype; L and D are fp32. The two methods are the fp32
pair's (flash.py, stored.py): "flash" keeps O and L, and its backward recomputes
S = scale Q K^T; "stored" also writes S (fp32, as the tensor cores' accumulators hold it, so
that both backwards form the same P) and its backward reads it. The atomic dQ accumulates in
an fp32 buffer, then one more launch rounds it (FlashAttention 2's convert_dQ); the
deterministic dQ kernel writes it directly.
"""

from __future__ import annotations

import numpy as np

from ckptlab import device
from ckptlab.kernels import archs
from ckptlab.kernels.common import Saved, ceil_div, check_options, check_saved, dropout_args
from ckptlab.kernels.nvrtc import cuda_include_options
from ckptlab.kernels.table import (
    SHARED_LIMIT,
    SOFTMAX_ROWS,
    TC,
    TC_BWD_TILES,
    TC_CONVERT_THREADS,
    TC_FWD_TILES,
    TC_SHARED_MAX,
    TC_TYPES,
    tc_block_threads,
    tc_bwd_shared_bytes,
    tc_dq_shared_bytes,
    tc_fwd_shared_bytes,
    tc_names,
    tc_tile_head_dim,
)

METHODS = ("flash", "stored")
_poison = True


def _is_16bit_dtype(dt) -> bool:
    """float16, or ml_dtypes' bfloat16 (compared by name first: an array of it means ml_dtypes
    is imported already, and this module does not import it, a second's work, for fp32 users)."""
    if dt is None:
        return False
    if dt == np.float16:
        return True
    if getattr(dt, "name", None) != "bfloat16":
        return False
    import ml_dtypes
    return dt == ml_dtypes.bfloat16


def is_16bit(a) -> bool:
    """True for an array of float16 or bfloat16: what the tensor-core kernels take."""
    return _is_16bit_dtype(getattr(a, "dtype", None))


def check_array(name: str, a, dtype=None, shape=None) -> None:
    if not device.is_device_array(a):
        raise TypeError(f"{name} must be a {device.xp().__name__} array on the "
                        f"{device.target()!r} target, got {type(a).__module__}."
                        f"{type(a).__name__}")
    if dtype is None and not _is_16bit_dtype(a.dtype):
        raise TypeError(f"{name} must have dtype float16 or bfloat16 for the tensor-core "
                        f"kernels, got {a.dtype}")
    if dtype is not None and a.dtype != dtype:
        raise TypeError(f"{name} must have the dtype of q ({dtype}), got {a.dtype}: mixed "
                        "precisions are not supported, cast first")
    if a.ndim != 4:
        raise ValueError(f"{name} must have rank 4 (B, H, N, d), got shape {tuple(a.shape)}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (the kernels ignore strides)")
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(a.shape)}")


def check_qkv(q, k, v) -> tuple:
    """(B, H, Nq, Nk, d, dtype) after checking q, k, v: one 16-bit dtype, matching shapes."""
    check_array("q", q)
    B, H, Nq, d = q.shape
    check_array("k", k, q.dtype)
    check_array("v", v, q.dtype)
    if k.shape[:2] != (B, H) or k.shape[3] != d:
        raise ValueError(f"k must have shape (B, H, Nk, d) = ({B}, {H}, Nk, {d}) to match q "
                         f"{tuple(q.shape)}, got {tuple(k.shape)}")
    if v.shape != k.shape:
        raise ValueError(f"v must have the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    tc_tile_head_dim(d)  # a clear error for a head dim the kernels cannot take
    Nk = k.shape[2]
    if min(B, H, Nq, Nk) < 1:
        raise ValueError(f"B, H, Nq and Nk must be >= 1, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}")
    if B * H > 65535:
        raise ValueError(f"B * H must be <= 65535 (one grid dimension), got {B * H}")
    return B, H, Nq, Nk, d, q.dtype


def check_tc_tiles(tiles, default, Dt: int, sizes, what: str) -> tuple:
    """(Br, Bc): multiples of 16 whose shared memory fits TC_SHARED_MAX."""
    Br, Bc = tiles or default
    for name, t in (("Br", Br), ("Bc", Bc)):
        if not isinstance(t, (int, np.integer)) or t % TC or not TC <= t <= 1024 // 2:
            raise ValueError(f"{what} tile {name} must be a multiple of {TC} in [{TC}, 512], "
                             f"got {t!r}")
    need = max(f(Dt, Br, Bc) for f in sizes)
    if need > TC_SHARED_MAX:
        raise ValueError(f"{what} tiles (Br, Bc) = ({Br}, {Bc}) need {need} bytes of shared "
                         f"memory at tile head dim {Dt}; at most {TC_SHARED_MAX} fit every "
                         "GPU: use smaller tiles")
    return int(Br), int(Bc)


def poisoned(shape, dtype):
    """A new array of the target filled with NaN (uninitialised inside unpoisoned())."""
    from ckptlab.kernels import common

    xp = device.xp()
    return xp.full(shape, np.nan, dtype=dtype) if common._poison else xp.empty(shape, dtype)


def _ctype(dtype) -> str:
    return TC_TYPES[np.dtype(dtype).name]


def _module(filename: str, ctype: str, Dt: int, wanted: tuple):
    """Every default instantiation of one (type, tile head dim) in one compile, or just the
    `wanted` ones when they are not defaults (custom tiles)."""
    fwd = filename == "attn_flash_fwd_tc.cu"
    defaults = tuple(n for role, n in tc_names(ctype, Dt).items() if role.startswith("fwd") == fwd)
    names = defaults if all(w in defaults for w in wanted) else tuple(wanted)
    arch = archs.current_arch()  # a T4 (sm_75) has no bf16 wmma: refused here, not by NVRTC
    if arch in archs.ARCHS:
        for name in wanted:
            archs.check(name, arch)
        names = tuple(n for n in names if archs.refusal(n, arch) is None)
    # on a GPU, NVRTC needs CUDA's mma.h and cuda_bf16.h; the emulator has its own
    options = cuda_include_options() if device.target() == "cuda" else ()
    return device.load(filename, options=options, name_expressions=names)


def _launch(mod, name, grid, block, args, shared):
    kernel = mod.get_function(name)
    if shared > SHARED_LIMIT:  # CUDA: more than 48 KiB of dynamic shared memory is opt-in
        kernel.max_dynamic_shared_size_bytes = shared
    return kernel(grid, block, args, shared_mem=shared)


def tc_forward(method, q, k, v, causal=False, scale=None, dropout_p=0.0, seed=0, offset=0, *,
               tiles=None):
    """One launch of attn_flash_fwd_tc<T, Dt, Br, Bc, method == "stored">: O (the inputs'
    dtype) and the Saved state (O, L fp32, and for "stored" the scores S)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    stored = method == "stored"
    B, H, Nq, Nk, d, dtype = check_qkv(q, k, v)
    causal, scale, p, seed, offset = check_options(causal, scale, dropout_p, seed, offset, d)
    Dt = tc_tile_head_dim(d)
    Br, Bc = check_tc_tiles(tiles, TC_FWD_TILES[Dt], Dt, (tc_fwd_shared_bytes,), "forward")
    O = poisoned((B, H, Nq, d), dtype)  # (B, H, Nq, d)
    L = poisoned((B, H, Nq), np.float32)  # (B, H, Nq)
    # stored: S (B, H, Nq, Nk) fp32, written on visible (i, j) only (the rest stays NaN)
    S = poisoned((B, H, Nq, Nk) if stored else (0,), np.float32)
    ctype = _ctype(dtype)
    name = tc_names(ctype, Dt, fwd=(Br, Bc))[f"fwd_{method}"]
    mod = _module("attn_flash_fwd_tc.cu", ctype, Dt, (name,))
    _launch(mod, name, (ceil_div(Nq, Br), B * H), (tc_block_threads(Br),),
            (q, k, v, O, L, S, np.int32(Nq), np.int32(Nk), np.int32(d), np.float32(scale),
             np.int32(causal), *dropout_args(p, seed, offset)),
            tc_fwd_shared_bytes(Dt, Br, Bc))
    tensors = {"O": O, "L": L, "S": S} if stored else {"O": O, "L": L}
    return O, Saved(method, tensors, causal, scale, p, seed, offset, (B, H, Nq, Nk, d))


def tc_backward(dO, q, k, v, saved, deterministic=False, *, tiles=None, method=None):
    """preprocess, dkdv<..., deterministic, stored> and then dq<..., stored> (deterministic)
    or the fp32 -> T conversion of the atomically accumulated dQ. Gradients in q's dtype.
    `method`, when given, is the one `saved` must come from ("flash" or "stored")."""
    B, H, Nq, Nk, d, dtype = check_qkv(q, k, v)
    check_array("dO", dO, dtype, (B, H, Nq, d))
    if not isinstance(saved, Saved) or saved.method not in METHODS:
        got = saved.method if isinstance(saved, Saved) else type(saved).__name__
        raise TypeError(f"saved must be what tc_forward returned, got {got}")
    if method is not None and saved.method != method:
        raise TypeError(f"saved must be what {method}_forward returned, got {saved.method}")
    O = saved.tensors.get("O") if isinstance(saved.tensors, dict) else None
    if is_16bit(O) and O.dtype != dtype:
        raise TypeError(f"saved holds a forward in {O.dtype}, but q is {dtype}")
    check_saved(saved, saved.method, B, H, Nq, Nk, d, dtype)
    if not isinstance(deterministic, (bool, np.bool_)):
        raise TypeError(f"deterministic must be a bool, got {deterministic!r}")
    method, deterministic = saved.method, bool(deterministic)
    Dt = tc_tile_head_dim(d)
    sizes = (tc_bwd_shared_bytes, tc_dq_shared_bytes)
    Br, Bc = check_tc_tiles(tiles, TC_BWD_TILES[Dt], Dt, sizes, "backward")
    O, L = saved.tensors["O"], saved.tensors["L"]
    S = saved.tensors["S"] if method == "stored" else poisoned((0,), np.float32)
    D = poisoned((B, H, Nq), np.float32)  # (B, H, Nq): D_i = rowsum(dO_i * O_i), a temporary
    # the atomic dQ's fp32 accumulator (B, H, Nq, d), a temporary; none when deterministic
    dQacc = poisoned((0,) if deterministic else q.shape, np.float32)
    dQ, dK, dV = poisoned(q.shape, dtype), poisoned(k.shape, dtype), poisoned(v.shape, dtype)
    ctype = _ctype(dtype)
    names = tc_names(ctype, Dt, bwd=(Br, Bc))
    dkdv, dq = names[f"dkdv_{method}_{deterministic}"], names[f"dq_{method}"]
    mod = _module("attn_flash_bwd_tc.cu", ctype, Dt, (names["preprocess"], names["convert"],
                                                      dkdv, dq))
    rows = B * H * Nq
    mod.get_function(names["preprocess"])(
        (ceil_div(rows, SOFTMAX_ROWS),), (32, SOFTMAX_ROWS),
        (O, dO, D, dQacc, np.int32(rows), np.int32(d), np.int32(deterministic)))
    args = (np.int32(Nq), np.int32(Nk), np.int32(d), np.float32(saved.scale),
            np.int32(saved.causal), *dropout_args(saved.dropout_p, saved.seed, saved.offset))
    _launch(mod, dkdv, (ceil_div(Nk, Bc), B * H), (tc_block_threads(Bc),),
            (q, k, v, dO, L, D, S, dQacc, dK, dV, *args), tc_bwd_shared_bytes(Dt, Br, Bc))
    if deterministic:
        _launch(mod, dq, (ceil_div(Nq, Br), B * H), (tc_block_threads(Br),),
                (q, k, v, dO, L, D, S, dQ, *args), tc_dq_shared_bytes(Dt, Br, Bc))
    else:
        n = B * H * Nq * d
        mod.get_function(names["convert"])((ceil_div(n, TC_CONVERT_THREADS),),
                                            (TC_CONVERT_THREADS,),
                                            (dQacc, dQ, np.int64(n)))
    return dQ, dK, dV
