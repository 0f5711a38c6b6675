"""Misusing nvcuda::wmma on the emulator is an EmuError that names the kernel, the block, the
thread and the kernel's line, as a GPU would hang or compute garbage: a lane that skips a
warp-collective call or exits before it, lanes passing different pointers, leading dimensions
or fill values, a tile that is not 32-byte aligned or an ldm that is not a multiple of 16 bytes,
a partial warp, and another lane's stored elements read without __syncwarp."""

import re

import numpy as np
import pytest

from ckptlab import emu

pytestmark = pytest.mark.counted  # byte counts, bounds and race checks

FAULTS = r"""#include <mma.h>
using namespace nvcuda;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> FragA;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> Acc;
extern "C" __global__ void healthy(const __half* A, float* D) {
    FragA a;
    wmma::load_matrix_sync(a, A, 16);
    D[threadIdx.x] = __half2float(a.x[0]);
}
extern "C" __global__ void lane_skips(const __half* A, float* D) {
    FragA a;
    if (threadIdx.x != 3) wmma::load_matrix_sync(a, A, 16);       // line 12
    D[threadIdx.x] = 0.0f;
}
extern "C" __global__ void lane_exits(const __half* A, float* D) {
    FragA a;
    if (threadIdx.x == 7) return;
    wmma::load_matrix_sync(a, A, 16);                               // line 18
}
extern "C" __global__ void mixed_pointer(const __half* A, float* D) {
    FragA a;
    wmma::load_matrix_sync(a, A + (threadIdx.x % 2) * 16, 16);      // line 22
}
extern "C" __global__ void mixed_ldm(const __half* A, float* D) {
    FragA a;
    wmma::load_matrix_sync(a, A, threadIdx.x < 16 ? 16 : 32);       // line 26
}
extern "C" __global__ void mixed_fill(float* D) {
    Acc c;
    wmma::fill_fragment(c, threadIdx.x == 9 ? 1.0f : 0.0f);         // line 30
}
extern "C" __global__ void misaligned(const __half* A, float* D) {
    FragA a;
    wmma::load_matrix_sync(a, A + 8, 16);                           // line 34: 16 bytes off
}
extern "C" __global__ void bad_ldm(const __half* A, float* D) {
    FragA a;
    wmma::load_matrix_sync(a, A, 12);                               // line 38: 24 bytes
}
extern "C" __global__ void different_calls(const __half* A, float* D) {
    FragA a;
    Acc c;
    if (threadIdx.x < 16) wmma::load_matrix_sync(a, A, 16);         // line 43
    else wmma::fill_fragment(c, 0.0f);                              // line 44
}
extern "C" __global__ void unsynced_read(float* D) {
    __shared__ __align__(32) float S[16][16];
    Acc c;
    wmma::fill_fragment(c, 1.0f);
    wmma::store_matrix_sync(&S[0][0], c, 16, wmma::mem_row_major);
    D[threadIdx.x] = S[15][threadIdx.x % 16];                      // line 51: no __syncwarp
}
"""


@pytest.fixture(scope="module")
def mod():
    return emu.RawModule(code=FAULTS, name="wmma_faults.cu")


def aligned(n, dtype, align=256):
    raw = np.empty(n * np.dtype(dtype).itemsize + align, np.uint8)
    start = -raw.ctypes.data % align
    out = raw[start:start + n * np.dtype(dtype).itemsize].view(dtype)
    out[:] = 1
    return out


def run(mod, name, block=32, **kw):
    A, D = aligned(16 * 32, np.float16), aligned(64, np.float32)
    args = (D,) if name in ("mixed_fill", "unsynced_read") else (A, D)
    return mod.get_function(name)((1,), (block,), args, **kw)


def expect(mod, name, lines, pattern, kind="warp", block=32):
    """The launch fails with `kind` at one of `lines` (an int, or (file, line) pairs)."""
    with pytest.raises(emu.EmuError) as info:
        run(mod, name, block)
    e = info.value
    lines = lines if isinstance(lines, list) else [("wmma_faults.cu", lines)]
    assert (e.kind, e.kernel) == (kind, name) and (e.file, e.line) in lines, str(e)
    assert e.block == (0, 0, 0) and e.thread is not None, str(e)
    assert re.search(pattern, str(e)), str(e)
    run(mod, "healthy")  # the process and the module go on
    return e


def test_a_lane_that_skips_the_call(mod):
    expect(mod, "lane_skips", 12, r"lane 3")


def test_a_lane_that_exits_before_the_call(mod):
    expect(mod, "lane_exits", 18, r"lane 7")


def test_lanes_with_different_pointers(mod):
    expect(mod, "mixed_pointer", 22, r"load_matrix_sync is warp-collective.*lane \d*[13579] passed")


def test_lanes_with_different_ldm(mod):
    expect(mod, "mixed_ldm", 26,
           r"ldm 16.*lane (1[6-9]|2\d|3[01]) passed \(pointer 0x[0-9a-f]+, ldm 32")


def test_lanes_with_different_fill_values(mod):
    expect(mod, "mixed_fill", 30, r"fill_fragment is warp-collective.*lane 9")


def test_a_misaligned_tile(mod):
    expect(mod, "misaligned", 34, r"not 256-bit \(32-byte\) aligned")


def test_an_ldm_that_is_not_16_bytes(mod):
    expect(mod, "bad_ldm", 38, r"ldm = 12 elements of 2 bytes is not a multiple of 16")


def test_lanes_at_different_calls(mod):
    at = [("wmma_faults.cu", 43), ("wmma_faults.cu", 44)]
    # named as what they are (they used to read "__shfl_sync", the exchange wmma is built on)
    expect(mod, "different_calls", at, r"different warp operations: an nvcuda::wmma call "
                                       r"\(mask 0xffffffff\) at \S+:4[34] and an nvcuda::wmma "
                                       r"call \(mask 0xffffffff\) at \S+:4[34]\b")


def test_a_partial_warp(mod):
    expect(mod, "healthy", 7, r"lane 16, which does not exist", block=16)


def test_reading_another_lanes_store_needs_syncwarp(mod):
    # found at the read (line 51) or, when a lane stores after another lane read there, at
    # the store inside wmma::store_matrix_sync, named by the kernel's line that called it (50)
    with pytest.raises(emu.EmuError) as info:
        run(mod, "unsynced_read")
    e = info.value
    assert e.kind == "race" and e.kernel == "unsynced_read", str(e)
    assert (e.file, e.line) in (("wmma_faults.cu", 51), ("wmma_faults.cu", 50)), str(e)
    assert "shared-memory race" in str(e) and e.thread is not None
    run(mod, "healthy")
