"""The emulator's __hfma, __double2half and __double2bfloat16 round once, as CUDA does, held to
exact rational arithmetic (Python's fractions): the exact a * b + c, or the exact double, rounded
to nearest even in the 16-bit format. Through float first, plain, would round twice: a double just
above a tie between two halves becomes the tie in float, then rounds to the even half
(__double2half(1 + 2^-11 + 2^-40) gave 1.0; __hfma(1.98483e-05, 1968, -30.171875) gave -30.125,
not -30.140625). Random cases, exact ties and their neighbours 2^-40 away, subnormals, overflow.
"""

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from ckptlab import device, emu

BF16 = ml_dtypes.bfloat16
FORMATS = {  # name: (dtype, precision with the implicit bit, least normal exponent, largest)
    "half": (np.float16, 11, -14, 15),
    "bf16": (BF16, 8, -126, 127),
}
SOURCE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define I (blockIdx.x * blockDim.x + threadIdx.x)
extern "C" __global__ void from_double(const double* x, unsigned short* h, unsigned short* b,
                                       int n) {
    if (I >= n) return;
    h[I] = __half_as_ushort(__double2half(x[I]));
    b[I] = __bfloat16_as_ushort(__double2bfloat16(x[I]));
}
extern "C" __global__ void fma_half(const __half* a, const __half* b, const __half* c, __half* out,
                                    int n) {
    if (I >= n) return;
    out[I] = __hfma(a[I], b[I], c[I]);
}
extern "C" __global__ void fma_bf16(const __nv_bfloat16* a, const __nv_bfloat16* b,
                                    const __nv_bfloat16* c, __nv_bfloat16* out, int n) {
    if (I >= n) return;
    out[I] = __hfma(a[I], b[I], c[I]);
}
"""


def module():
    if device.target() == "cuda":
        import cupy

        from ckptlab.kernels.nvrtc import cuda_include_options

        return cupy.RawModule(code=SOURCE, options=("-std=c++17", *cuda_include_options()))
    return emu.RawModule(code=SOURCE, name="test_half_rounding.cu")


def launch(mod, name, n, *args):
    mod.get_function(name)((-(-n // 256),), (256,), (*args, np.int32(n)))


def round_exact(x: Fraction, fmt: str) -> float:
    """x rounded to nearest even in `fmt` (subnormals, overflow to inf), as a float64."""
    _, p, emin, emax = FORMATS[fmt]
    if x == 0:
        return 0.0
    a = abs(x)
    e = a.numerator.bit_length() - a.denominator.bit_length()  # 2^e <= a < 2^(e+2)
    if Fraction(2) ** e > a:
        e -= 1
    elif Fraction(2) ** (e + 1) <= a:
        e += 1
    ulp = Fraction(2) ** (max(e, emin) - p + 1)
    m = a / ulp
    n = m.numerator // m.denominator
    rest = m - n
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2):
        n += 1
    r = n * ulp
    v = float("inf") if r >= Fraction(2) ** (emax + 1) else float(r)
    return v if x > 0 else -v


def near_ties(rng, fmt, k):
    """Doubles at the midpoint of two adjacent `fmt` values, and 2^-40 (relative) either side."""
    dt, p, emin, emax = FORMATS[fmt]
    e = rng.integers(emin - p + 2, emax, k)
    lo = np.ldexp(1 + rng.integers(0, 2 ** (p - 1), k) / 2 ** (p - 1), e)
    step = np.ldexp(1.0, np.maximum(e, emin) - p + 1)
    mid = lo + step / 2
    return np.concatenate([mid, mid * (1 + 2.0**-40), mid * (1 - 2.0**-40)])


def test_double_to_16_bits_rounds_once():
    rng = np.random.default_rng()
    x = np.concatenate([
        near_ties(rng, "half", 3000), near_ties(rng, "bf16", 3000),
        rng.standard_normal(20000) * np.exp2(rng.uniform(-30, 17, 20000)),
        rng.standard_normal(2000) * np.exp2(rng.uniform(-140, 128, 2000)),
        [1 + 2.0**-11 + 2.0**-40, 65519.99, 65520.0, 2.0**-25, 2.0**-25 * (1 + 2.0**-40),
         3.3961e38, 1e300, 0.0]])
    x = np.concatenate([x, -x])
    h, b = np.zeros(x.size, np.uint16), np.zeros(x.size, np.uint16)
    launch(module(), "from_double", x.size, x, h, b)
    for got, fmt in ((h, "half"), (b, "bf16")):
        want = np.array([round_exact(Fraction(v), fmt) for v in x])
        bad = np.flatnonzero(got.view(FORMATS[fmt][0]).astype(np.float64) != want)
        assert bad.size == 0, [(fmt, x[i], want[i]) for i in bad[:5]]
    assert float(h[x.tolist().index(1 + 2.0**-11 + 2.0**-40)].view(np.float16)) == 1 + 2.0**-10


@pytest.mark.parametrize("fmt", ["half", "bf16"])
def test_hfma_rounds_once(fmt):
    rng = np.random.default_rng()
    dt, p, _, _ = FORMATS[fmt]
    n = 20000
    c = (rng.standard_normal(n) * np.exp2(rng.integers(-8, 8, n))).astype(dt)
    # half the products near c's last place, where the sum lands on or beside a tie
    ulp_c = np.exp2(np.floor(np.log2(np.abs(c.astype(np.float64)) + 2.0**-60)) - p + 1)
    near = rng.uniform(0.25, 2, n) * ulp_c
    mag = np.where(np.arange(n) % 2 == 0, near, np.exp2(rng.uniform(-8, 8, n)))
    a = (rng.standard_normal(n) * np.sqrt(mag)).astype(dt)
    b = (rng.standard_normal(n) * np.sqrt(mag)).astype(dt)
    if fmt == "half":  # the case that rounded twice before
        a[0], b[0], c[0] = dt(1.9848346710205078e-05), dt(1968), dt(-30.171875)
    out = np.full(n, np.nan, dt)
    launch(module(), f"fma_{fmt}", n, a, b, c, out)
    exact = zip(*([Fraction(v) for v in arr.astype(np.float64).tolist()] for arr in (a, b, c)),
                strict=True)
    want = np.array([round_exact(x * y + z, fmt) for x, y, z in exact])
    bad = np.flatnonzero(out.astype(np.float64) != want)
    assert bad.size == 0, [(a[i], b[i], c[i], out[i], want[i]) for i in bad[:5]]
    if fmt == "half":
        assert float(out[0]) == -30.140625
