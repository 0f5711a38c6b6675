"""The emulator's cuda_fp16.h and cuda_bf16.h (ckptlab/emu/include) against NumPy and ml_dtypes.

Conversions must be bit-exact: float -> half and float -> bf16 round to nearest even (ties,
subnormals, overflow to inf included), half/bf16 -> float is exact for all 65,536 patterns.
Arithmetic must be correctly rounded: the float64 result of two halves is exact (+, -, *) or
rounded innocuously (/), so rounding it once to the 16-bit format is the truth.
The same kernels run on a GPU in the gpu-marked test, which compares the bits with the chip's.
"""

import ml_dtypes
import numpy as np
import pytest

from ckptlab import device, emu

BF16 = ml_dtypes.bfloat16
SOURCE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define I (blockIdx.x * blockDim.x + threadIdx.x)
extern "C" __global__ void from_float(const float* x, unsigned short* h, unsigned short* b,
                                      unsigned short* hz, unsigned short* bz, int n) {
    if (I >= n) return;
    h[I] = __half_as_ushort(__float2half(x[I]));
    b[I] = __bfloat16_as_ushort(__float2bfloat16(x[I]));
    hz[I] = __half_as_ushort(__float2half_rz(x[I]));
    bz[I] = __bfloat16_as_ushort(__float2bfloat16_rz(x[I]));
}
extern "C" __global__ void to_float(const unsigned short* bits, float* h, float* b, int n) {
    if (I >= n) return;
    h[I] = __half2float(__ushort_as_half(bits[I]));
    b[I] = __bfloat162float(__ushort_as_bfloat16(bits[I]));
}
extern "C" __global__ void half_ops(const __half* a, const __half* b, __half* out, int n) {
    if (I >= n) return;
    out[4 * I + 0] = __hadd(a[I], b[I]);
    out[4 * I + 1] = a[I] - b[I];
    out[4 * I + 2] = __hmul(a[I], b[I]);
    out[4 * I + 3] = a[I] / b[I];
}
extern "C" __global__ void bf16_ops(const __nv_bfloat16* a, const __nv_bfloat16* b,
                                    __nv_bfloat16* out, int n) {
    if (I >= n) return;
    out[4 * I + 0] = __hadd(a[I], b[I]);
    out[4 * I + 1] = a[I] - b[I];
    out[4 * I + 2] = __hmul(a[I], b[I]);
    out[4 * I + 3] = a[I] / b[I];
}
extern "C" __global__ void pairs(const float* x, float* out, int n) {
    if (I >= n) return;
    const __half2 p = __floats2half2_rn(x[2 * I], x[2 * I + 1]);
    const __half2 q = __halves2half2(__low2half(p), __high2half(p));
    const float2 f = __half22float2(__hfma2(p, __float2half2_rn(2.0f), q));  // 2p + p
    out[2 * I] = f.x;
    out[2 * I + 1] = f.y;
}
"""


def module():
    if device.target() == "cuda":
        import cupy

        from ckptlab.kernels.nvrtc import cuda_include_options

        return cupy.RawModule(code=SOURCE, options=("-std=c++17", *cuda_include_options()))
    return emu.RawModule(code=SOURCE, name="test_half.cu")


def launch(mod, name, n, *args):
    mod.get_function(name)((-(-n // 256),), (256,), (*args, np.int32(n)))


def interesting_floats(rng):
    """Floats where rounding to 16 bits is hard: exact ties and their neighbours at every
    exponent of both formats, subnormal halves, the overflow edge, zeros, infinities, NaN."""
    ties = []
    for e in range(-26, 17):  # half: ties sit 2^(e-11) apart, at odd multiples of 2^(e-11)
        step = 2.0 ** (e - 11) if e >= -14 else 2.0 ** -25
        base = 2.0 ** e
        ties += [base + k * step for k in range(1, 8, 2)]
    bties = [np.float32(2.0 ** e * (1 + (2 * k + 1) / 256)) for e in range(-130, 128, 7)
             for k in range(3)]
    special = [0.0, -0.0, 65504.0, 65519.0, 65520.0, 65536.0, 1e30, 3.4e38, 2.0 ** -24,
               2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -14 - 2.0 ** -25, 1e-45, np.inf, -np.inf]
    x = np.array(ties + bties + special, dtype=np.float32)
    x = np.concatenate([x, np.nextafter(x, np.float32(np.inf)), np.nextafter(x, -np.inf), -x])
    spread = rng.standard_normal(20000) * np.exp2(rng.uniform(-30, 20, 20000))
    return np.concatenate([x, spread.astype(np.float32), [np.nan]]).astype(np.float32)


def bits(a, dtype):
    with np.errstate(over="ignore"):  # floats past the 16-bit range become inf, as they should
        return np.asarray(a, dtype=dtype).view(np.uint16)


def test_float_to_half_and_bf16_round_to_nearest_even():
    rng = np.random.default_rng()
    x = interesting_floats(rng)
    n = x.size
    h, b, hz, bz = (np.zeros(n, np.uint16) for _ in range(4))
    launch(module(), "from_float", n, x, h, b, hz, bz)
    finite = ~np.isnan(x)
    np.testing.assert_array_equal(h[finite], bits(x[finite], np.float16))
    np.testing.assert_array_equal(b[finite], bits(x[finite], BF16))
    # NaN: CUDA's canonical NaN of each format
    assert h[~finite].tolist() == [0x7FFF] and b[~finite].tolist() == [0x7FFF]
    # toward zero: the 16-bit value of largest magnitude not above |x|, same sign
    for got, dt in ((hz, np.float16), (bz, BF16)):
        v = got[finite].view(dt).astype(np.float64)
        xf = x[finite].astype(np.float64)
        assert np.all(np.abs(v) <= np.abs(xf)) and np.all(np.sign(v) * np.sign(xf) >= 0)
        with np.errstate(over="ignore"):
            up = np.nextafter(np.abs(v).astype(dt), dt(np.inf)).astype(np.float64)
        assert np.all((up > np.abs(xf)) | np.isinf(xf))


def test_every_16_bit_pattern_converts_to_float_exactly():
    patterns = np.arange(65536, dtype=np.uint16)
    h, b = np.full(65536, np.nan, np.float32), np.full(65536, np.nan, np.float32)
    launch(module(), "to_float", 65536, patterns, h, b)
    want_h = patterns.view(np.float16).astype(np.float32)
    want_b = patterns.view(BF16).astype(np.float32)
    for got, want in ((h, want_h), (b, want_b)):
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan)
        np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


@pytest.mark.parametrize("fmt", ["half", "bf16"])
def test_arithmetic_is_correctly_rounded(fmt):
    rng = np.random.default_rng()
    dt = np.float16 if fmt == "half" else BF16
    n = 5000
    scale = np.exp2(rng.integers(-6, 6, n))
    a = (rng.standard_normal(n) * scale).astype(dt)
    b = (rng.standard_normal(n) * scale[::-1]).astype(dt)
    b[b == 0] = dt(1.0)
    out = np.full(4 * n, np.nan, dt)
    launch(module(), f"{fmt}_ops", n, a, b, out)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = np.stack([a64 + b64, a64 - b64, a64 * b64, a64 / b64], axis=1).reshape(-1)
    np.testing.assert_array_equal(out.view(np.uint16), bits(want, dt))


def test_half2_pairs_keep_x_low_and_y_high():
    rng = np.random.default_rng()
    n = 300
    x = rng.standard_normal(2 * n).astype(np.float32)
    out = np.full(2 * n, np.nan, np.float32)
    launch(module(), "pairs", n, x, out)
    h = x.astype(np.float16).astype(np.float64)
    np.testing.assert_array_equal(out, (3 * h).astype(np.float16).astype(np.float32))
