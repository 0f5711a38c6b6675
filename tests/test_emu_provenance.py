"""Each access is checked against the object its pointer came from: a kernel argument, a
__shared__ array, a __device__ variable, a block from device malloc. An out-of-bounds index
that would land in a neighbour is reported as out of bounds of its own object, never counted
against the neighbour; writes through const parameters and misaligned vector accesses are
errors as on a GPU (compute-sanitizer's memcheck: "Invalid __global__ write", "Address ... is
misaligned"); valid CUDA (atomics on a __device__ variable, device malloc) raises nothing."""

import numpy as np
import pytest

from ckptlab import emu

pytestmark = pytest.mark.counted  # byte counts, bounds and race checks

PROVENANCE = r"""
extern "C" __global__ void write_at(float* a, const float* b, long long n) {
    a[n + threadIdx.x] = 5.0f;                     // line 3: n = the distance from a to b
}
extern "C" __global__ void shared_neighbours(float* out) {
    __shared__ float a[32], b[32];
    b[threadIdx.x] = 1.0f;
    a[32 + threadIdx.x] = 9.0f;                    // line 8: one past a is b[0] on a bump arena
    __syncthreads();                               // a[] written before it is read
    out[threadIdx.x] = b[threadIdx.x];
}
__device__ float g[4];
__device__ float h[4];
extern "C" __global__ void device_overrun(float* out, int i) {
    g[i] = 7.0f;                                   // line 15
    out[0] = h[0];
}
extern "C" __global__ void const_write(const float* in, float* out) {
    const_cast<float*>(in)[threadIdx.x] = 42.0f;   // line 19: a const parameter
    out[threadIdx.x] = in[threadIdx.x];
}
extern "C" __global__ void misaligned_float4(const float* in, float4* out) {
    out[0] = reinterpret_cast<const float4*>(in + 1)[0];   // line 23: 4-byte aligned only
}
extern "C" __global__ void misaligned_double(const float* in, double* out) {
    out[0] = *reinterpret_cast<const double*>(in + 1);     // line 26
}
extern "C" __global__ void aligned_float4(const float* in, float4* out) {
    out[threadIdx.x] = reinterpret_cast<const float4*>(in)[threadIdx.x];
}
__device__ unsigned counter;
extern "C" __global__ void count_threads(unsigned* out) {
    atomicAdd(&counter, 1u);                       // a __device__ variable: valid CUDA
}
extern "C" __global__ void read_counter(unsigned* out) { out[0] = counter; }
extern "C" __global__ void device_malloc(float* out) {
    float* p = (float*)malloc(16 * sizeof(float)); // device malloc: valid CUDA
    for (int i = 0; i < 16; ++i) p[i] = (float)(i + threadIdx.x);
    float s = 0.0f;
    for (int i = 0; i < 16; ++i) s += p[i];
    free(p);
    out[threadIdx.x] = s;
}
extern "C" __global__ void malloc_overrun(float* out) {
    float* p = (float*)malloc(16 * sizeof(float));
    p[16] = 1.0f;                                  // line 46: one past the block
    free(p);
}
extern "C" __global__ void double_free(float* out) {
    float* p = (float*)malloc(16 * sizeof(float));
    free(p);
    free(p);                                       // line 52
}
extern "C" __global__ void use_after_free(float* out) {
    float* p = (float*)malloc(16 * sizeof(float));
    free(p);
    out[0] = p[0];                                 // line 57
}
"""


@pytest.fixture(scope="module")
def mod():
    return emu.RawModule(code=PROVENANCE, name="prov.cu")


def test_an_index_into_the_next_argument_is_out_of_bounds_of_its_own(mod):
    """n = the distance between the two arrays, so a[n] is b[0] in the
    address space: reported as past the end of a, b unchanged, nothing counted against b."""
    buf = np.zeros(64, np.float32)
    a, b = buf[:32], buf[32:]  # adjacent in memory: a[32] is b[0]
    n = (b.ctypes.data - a.ctypes.data) // 4
    with emu.record() as rec, pytest.raises(emu.EmuError, match=r"out-of-bounds write .*'a'") as e:
        mod.get_function("write_at")((1,), (4,), (a, b, np.int64(n)))
    assert e.value.kind == "access" and e.value.line == 3
    assert (b == 0).all()
    assert not rec.launches  # a faulting launch publishes no counts


def test_a_far_index_is_still_out_of_bounds_of_its_own_argument(mod):
    a, b = np.zeros(32, np.float32), np.zeros(1 << 16, np.float32)
    for n in (32, 1000, 1 << 20, -(1 << 20)):
        with pytest.raises(emu.EmuError, match=r"out-of-bounds write .*argument 'a'"):
            mod.get_function("write_at")((1,), (1,), (a, b, np.int64(n)))
    assert (b == 0).all()


def test_one_past_a_shared_array_is_not_its_neighbour(mod):
    with pytest.raises(emu.EmuError, match=r"out-of-bounds write .*__shared__ (array )?'?a'?") as e:
        mod.get_function("shared_neighbours")((1,), (32,), (np.zeros(32, np.float32),))
    assert e.value.line == 8 and e.value.thread == (0, 0, 0)


@pytest.mark.parametrize("i", [4, 5, 1000, 1 << 22, -1])
def test_overrunning_a_device_variable_is_reported(mod, i):
    """A __device__ array overrun never reaches its neighbour nor the emulator's own state."""
    out = np.zeros(1, np.float32)
    with pytest.raises(emu.EmuError, match=r"out-of-bounds write|invalid memory access") as e:
        mod.get_function("device_overrun")((1,), (1,), (out, np.int32(i)))
    assert e.value.kind in ("access", "signal")
    mod.get_function("device_overrun")((1,), (1,), (out, np.int32(3)))  # in bounds: fine
    assert out[0] == 0  # h was never written


def test_a_write_through_a_const_parameter_is_an_error(mod):
    x, out = np.arange(8, dtype=np.float32), np.zeros(8, np.float32)
    with pytest.raises(emu.EmuError, match=r"write through a const parameter 'in'") as e:
        mod.get_function("const_write")((1,), (8,), (x, out))
    assert e.value.kind == "access" and e.value.line == 19
    assert np.array_equal(x, np.arange(8, dtype=np.float32))


def test_an_immutable_buffer_stays_immutable(mod):
    data = np.arange(8, dtype=np.float32).tobytes()
    x = np.frombuffer(data, np.float32)  # read-only, backed by a bytes object
    with pytest.raises(emu.EmuError, match="const parameter"):
        mod.get_function("const_write")((1,), (8,), (x, np.zeros(8, np.float32)))
    assert data == np.arange(8, dtype=np.float32).tobytes()


@pytest.mark.parametrize("kernel,line,size", [("misaligned_float4", 23, 16),
                                              ("misaligned_double", 26, 8)])
def test_misaligned_vector_access_is_an_error(mod, kernel, line, size):
    x = np.arange(16, dtype=np.float32)
    out = np.zeros(4, np.float32) if size == 16 else np.zeros(1, np.float64)
    # (GCC's alignment check, before the access, or the memory hook's, at it)
    with pytest.raises(emu.EmuError, match=rf"misaligned .*a multiple of {size}\b") as e:
        mod.get_function(kernel)((1,), (1,), (x, out))
    assert e.value.kind == "access" and e.value.line == line


def test_aligned_vector_access_is_fine(mod):
    x = np.arange(16, dtype=np.float32)
    out = np.zeros((4, 4), np.float32)
    launch = mod.get_function("aligned_float4")((1,), (4,), (x, out))
    assert np.array_equal(out.ravel(), x) and launch.args["in"].read_bytes == 64


def test_atomics_on_a_device_variable_are_valid(mod):
    out = np.zeros(1, np.uint32)
    mod.get_function("count_threads")((3,), (64,), (out,))
    mod.get_function("read_counter")((1,), (1,), (out,))
    first = int(out[0])
    mod.get_function("count_threads")((2,), (32,), (out,))  # __device__ memory persists
    mod.get_function("read_counter")((1,), (1,), (out,))
    assert int(out[0]) == first + 64 and first % 192 == 0


def test_device_malloc_is_valid_memory(mod):
    out = np.full(8, np.nan, np.float32)
    mod.get_function("device_malloc")((1,), (8,), (out,))
    assert np.array_equal(out, np.array([120 + 16 * t for t in range(8)], np.float32))


def test_device_malloc_bounds_and_use_after_free(mod):
    out = np.zeros(1, np.float32)
    with pytest.raises(emu.EmuError, match=r"out-of-bounds write .*malloc") as e:
        mod.get_function("malloc_overrun")((1,), (1,), (out,))
    assert e.value.line == 46
    with pytest.raises(emu.EmuError, match=r"out-of-bounds read|freed") as e:
        mod.get_function("use_after_free")((1,), (1,), (out,))
    assert e.value.line == 57
    with pytest.raises(emu.EmuError, match=r"free\(0x[0-9a-f]+\): not an address device malloc "
                                           r"returned, or freed already") as e:
        mod.get_function("double_free")((1,), (1,), (out,))
    assert e.value.line == 52
    mod.get_function("device_malloc")((1,), (8,), (np.zeros(8, np.float32),))  # still fine
