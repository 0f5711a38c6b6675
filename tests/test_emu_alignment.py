"""Counted mode reports a dereference through a pointer that is not a multiple of its type's
alignment, as a GPU faults on it (cudaErrorMisalignedAddress), even where GCC splits the access
into scalar loads and stores that are each aligned (a float4 summed, a float2 copied field by
field): the EmuError names the kernel, block, thread, line, the type and the object. Aligned
accesses of every vector type run and give the right values."""

import numpy as np
import pytest

from ckptlab import emu

pytestmark = pytest.mark.counted

SRC = r"""
extern "C" __global__ void sum4(const float* in, float* out, int shift) {
    const int t = threadIdx.x;
    const int s = t == 5 ? shift : 0;                                          // line 4
    float4 v = reinterpret_cast<const float4*>(in + 4 * t + s)[0];             // line 5
    out[t] = v.x + v.y + v.z + v.w;
}
extern "C" __global__ void store2(float* out, int shift) {
    const int t = threadIdx.x;
    float2 v;
    v.x = t;
    v.y = -t;
    reinterpret_cast<float2*>(out + 2 * t + (t == 3 ? shift : 0))[0] = v;      // line 13
}
extern "C" __global__ void shared_pair(float* out, int shift) {
    __shared__ float tile[64];
    const int t = threadIdx.x;
    tile[t] = t;
    tile[t + 32] = t + 32;
    __syncthreads();
    double d = reinterpret_cast<const double*>(tile + 2 * (t % 16) + shift)[0]; // line 21
    float2 p = *reinterpret_cast<float2*>(&d);
    out[t] = p.x + p.y;
}
"""


@pytest.fixture(scope="module")
def mod():
    return emu.RawModule(code=SRC, name="align.cu")


def fault(fn, grid, block, args):
    with pytest.raises(emu.EmuError) as e:
        fn(grid, block, args)
    return e.value


def test_a_misaligned_float4_summed_in_scalars_is_reported(mod):
    fn = mod.get_function("sum4")
    x = np.random.default_rng().standard_normal(4 * 8 + 4).astype(np.float32)
    out = np.full(8, np.nan, np.float32)
    fn((1,), (8,), (x, out, np.int32(0)))  # aligned: right values
    assert np.allclose(out, x[:32].reshape(8, 4).sum(1), rtol=1e-6)
    for shift in (1, 2, 3):
        e = fault(fn, (1,), (8,), (x, out, np.int32(shift)))
        assert (e.kind, e.kernel, e.block, e.thread) == ("access", "sum4", (0, 0, 0), (5, 0, 0))
        assert (e.file, e.line) == ("align.cu", 5)
        assert "misaligned address" in str(e) and "float4" in str(e)
        assert "multiple of 16 bytes" in str(e)
        assert f"byte {4 * (4 * 5 + shift)} of argument 'in'" in str(e)


def test_a_misaligned_float2_stored_field_by_field_is_reported(mod):
    fn = mod.get_function("store2")
    out = np.full(2 * 8 + 2, np.nan, np.float32)
    fn((1,), (8,), (out, np.int32(0)))
    assert np.array_equal(out[:16], np.stack([np.arange(8), -np.arange(8)], 1).ravel())
    e = fault(fn, (1,), (8,), (out, np.int32(1)))
    assert e.thread == (3, 0, 0) and e.line == 13 and "float2" in str(e)
    assert "multiple of 8 bytes" in str(e) and "argument 'out'" in str(e)


def test_a_misaligned_double_in_shared_memory_is_reported(mod):
    fn = mod.get_function("shared_pair")
    out = np.full(32, np.nan, np.float32)
    fn((1,), (32,), (out, np.int32(0)))
    t = np.arange(32) % 16
    assert np.array_equal(out, (2 * t + 2 * t + 1).astype(np.float32))
    e = fault(fn, (2,), (32,), (out, np.int32(1)))
    assert e.line == 21 and "double" in str(e) and "__shared__ 'tile'" in str(e)
    assert e.block == (0, 0, 0) and e.thread == (0, 0, 0)
