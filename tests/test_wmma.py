"""The emulator's nvcuda::wmma (ckptlab/emu/include/mma.h) against NumPy.

Each call on its own tile: fill_fragment, load_matrix_sync (matrix_a, matrix_b in row and column
major, the accumulator in both memory layouts), mma_sync, store_matrix_sync, with leading
dimensions wider than the tile whose gaps hold NaN (an element read from a gap poisons the
result). D = A B + C must equal the fp32 sum of exact products in k order, bit for bit, and
float64 within fp32 rounding. tf32: __float_to_tf32 rounds to nearest, ties away from zero;
mma_sync reads the top 19 bits of an unrounded float. Counted bytes of kernels/wmma_gemm.cu
equal the traffic model. Misuse is in tests/test_wmma_faults.py.
"""

import ml_dtypes
import numpy as np
import pytest

from ckptlab import device, emu
from ckptlab.measure import traffic

BF16 = ml_dtypes.bfloat16
TYPES = {"__half": np.float16, "__nv_bfloat16": BF16}
LAYOUTS = ("row_major", "col_major")
SOURCE = r"""
#include <mma.h>
using namespace nvcuda;

// D = A B + C on one 16 x 16 tile, A and B in memory layouts LA, LB with leading dimensions
// lda, ldb; C and D row- or column-major with ldc, ldd.
template <class T, class L, int K> using Elem =
    typename wmma::fragment<wmma::matrix_a, 16, 16, K, T, L>::storage_element_type;
template <class T, class LA, class LB, int K>
__global__ void mma_tile(const Elem<T, LA, K>* A, const Elem<T, LB, K>* B, const float* C,
                         float* D, int lda, int ldb, int ldc, int ldd,
                         int c_col, int d_col, int round_tf32) {
    wmma::fragment<wmma::matrix_a, 16, 16, K, T, LA> a;
    wmma::fragment<wmma::matrix_b, 16, 16, K, T, LB> b;
    wmma::fragment<wmma::accumulator, 16, 16, K, float> c;
    wmma::load_matrix_sync(a, A, lda);
    wmma::load_matrix_sync(b, B, ldb);
    wmma::load_matrix_sync(c, C, ldc, c_col ? wmma::mem_col_major : wmma::mem_row_major);
    if (round_tf32) {
        for (int i = 0; i < a.num_elements; ++i) a.x[i] = wmma::__float_to_tf32(a.x[i]);
        for (int i = 0; i < b.num_elements; ++i) b.x[i] = wmma::__float_to_tf32(b.x[i]);
    }
    wmma::mma_sync(c, a, b, c);
    wmma::store_matrix_sync(D, c, ldd, d_col ? wmma::mem_col_major : wmma::mem_row_major);
}

// fill_fragment on all three uses: D = fill(a) fill(b) + fill(c), and a plain fill stored to E
extern "C" __global__ void fills(float* D, float* E, float va, float vb, float vc) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c, e;
    wmma::fill_fragment(a, __float2bfloat16(va));
    wmma::fill_fragment(b, __float2bfloat16(vb));
    wmma::fill_fragment(c, vc);
    wmma::fill_fragment(e, vc);
    wmma::mma_sync(c, a, b, c);
    wmma::store_matrix_sync(D, c, 16, wmma::mem_row_major);
    wmma::store_matrix_sync(E, e, 16, wmma::mem_col_major);
}

extern "C" __global__ void to_tf32(const float* x, float* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = wmma::__float_to_tf32(x[i]);
}

// Layout-dependent code: reuse the accumulator's x[i] as matrix_a's x[i]. D = that "A" times
// the identity. Correct only if the two fragments share a layout, which nobody promises.
extern "C" __global__ void reuse_accumulator_as_a(const float* C, const __half* I, float* D) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
    wmma::load_matrix_sync(c, C, 16, wmma::mem_row_major);
    wmma::load_matrix_sync(b, I, 16);
    for (int i = 0; i < a.num_elements; ++i) a.x[i] = __float2half(c.x[i]);
    wmma::fill_fragment(c, 0.0f);
    wmma::mma_sync(c, a, b, c);
    wmma::store_matrix_sync(D, c, 16, wmma::mem_row_major);
}
"""


def module(expressions=()):
    if device.target() == "cuda":
        import cupy

        from ckptlab.kernels.nvrtc import cuda_include_options

        return cupy.RawModule(code=SOURCE, options=("-std=c++17", *cuda_include_options()),
                              name_expressions=expressions)
    return emu.RawModule(code=SOURCE, name="test_wmma.cu", name_expressions=expressions)


def tile_name(ctype, la, lb, k=16):
    return (f"mma_tile<{ctype}, nvcuda::wmma::{la}, nvcuda::wmma::{lb}, {k}>")


def aligned(a, align=256):
    """A copy of the 1-D array `a` at an address that is a multiple of `align` bytes, as
    cudaMalloc gives (wmma needs 32; NumPy promises 16)."""
    raw = np.empty(a.nbytes + align, np.uint8)
    start = -raw.ctypes.data % align
    out = raw[start:start + a.nbytes].view(a.dtype)
    out[:] = a
    return out


def in_memory(M, ld, col_major, dtype):
    """M (rows x cols) laid out with leading dimension ld; the gaps hold NaN."""
    rows, cols = M.shape
    outer, inner = (cols, rows) if col_major else (rows, cols)
    buf = np.full((outer, ld), np.nan, np.float32)
    buf[:, :inner] = M.T if col_major else M
    return aligned(buf.astype(dtype).reshape(-1))


def from_memory(buf, shape, ld, col_major):
    rows, cols = shape
    outer, inner = (cols, rows) if col_major else (rows, cols)
    m = buf.reshape(outer, ld)[:, :inner]
    return m.T if col_major else m


def fp32_mma(A, B, C):
    """fp32 D = A B + C, exact products summed into C in k order: the emulator's promise."""
    acc = C.astype(np.float32).copy()
    for kk in range(A.shape[1]):
        acc = (acc + A[:, kk:kk + 1].astype(np.float32) * B[kk:kk + 1, :].astype(np.float32))
    return acc.astype(np.float32)


def run_tile(mod, name, A, B, C, lds, layouts, dtype, round_tf32=0):
    lda, ldb, ldc, ldd = lds
    la, lb, c_col, d_col = layouts
    xp = device.xp()
    args = [in_memory(A, lda, la == "col_major", dtype),
            in_memory(B, ldb, lb == "col_major", dtype), in_memory(C, ldc, c_col, np.float32)]
    D = aligned(np.full(16 * ldd, np.nan, np.float32))
    args = [xp.asarray(a) for a in args] + [xp.asarray(D)]
    mod.get_function(name)((1,), (32,), (*args, *(np.int32(x) for x in lds), np.int32(c_col),
                                         np.int32(d_col), np.int32(round_tf32)))
    return from_memory(device.to_numpy(args[3]), (16, 16), ldd, d_col)


@pytest.mark.parametrize("ctype", TYPES)
def test_mma_every_layout_and_leading_dimension(ctype):
    dt = TYPES[ctype]
    names = [tile_name(ctype, la, lb) for la in LAYOUTS for lb in LAYOUTS]
    mod = module(tuple(names))
    rng = np.random.default_rng()
    for la in LAYOUTS:
        for lb in LAYOUTS:
            for c_col in (0, 1):
                A = rng.standard_normal((16, 16)).astype(dt)
                B = rng.standard_normal((16, 16)).astype(dt)
                C = rng.standard_normal((16, 16)).astype(np.float32)
                lds = tuple(int(x) for x in rng.choice([16, 24, 40], 4))
                d_col = int(rng.integers(2))
                D = run_tile(mod, tile_name(ctype, la, lb), A, B, C, lds,
                             (la, lb, c_col, d_col), dt)
                ref = A.astype(np.float64) @ B.astype(np.float64) + C
                np.testing.assert_allclose(D, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
                if device.target() == "emu":  # exact products, fp32 sums in k order
                    np.testing.assert_array_equal(D, fp32_mma(A, B, C))


def chop(x):
    """The top 19 bits of each float: what the tensor core reads of an unrounded input."""
    return (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def rna_tf32(x):
    """Round to 11 significant bits, ties away from zero, in float64 (independent of the
    kernel's bit trick): cvt.rna.tf32.f32."""
    m, e = np.frexp(x.astype(np.float64))
    r = np.sign(m) * np.floor(np.abs(m) * 2048 + 0.5)
    return np.ldexp(r, e - 11).astype(np.float32)


def test_float_to_tf32_rounds_ties_away_from_zero():
    rng = np.random.default_rng()
    base = rng.standard_normal(2000).astype(np.float32)
    b = base.view(np.uint32) & np.uint32(0xFFFFE000)
    ties = (b | np.uint32(0x1000)).view(np.float32)  # exactly halfway between two tf32 values
    x = np.concatenate([base, ties, -ties, [0.0, np.inf, -np.inf]]).astype(np.float32)
    y = np.full_like(x, np.nan)
    module().get_function("to_tf32")((-(-x.size // 256),), (256,), (x, y, np.int32(x.size)))
    np.testing.assert_array_equal(y[:-3], rna_tf32(x[:-3]))
    assert y[-3] == 0.0 and y[-2] == np.inf and y[-1] == -np.inf
    assert np.all(np.abs(y[2000:4000]) > np.abs(b.view(np.float32)))  # ties went away from 0


@pytest.mark.parametrize("round_tf32", [0, 1])
def test_tf32_mma_reads_19_bits(round_tf32):
    names = [tile_name("nvcuda::wmma::precision::tf32", la, lb, 8) for la in LAYOUTS
             for lb in LAYOUTS]
    mod = module(tuple(names))
    rng = np.random.default_rng()
    for la in LAYOUTS:
        for lb in LAYOUTS:
            A = rng.standard_normal((16, 8)).astype(np.float32)
            B = rng.standard_normal((8, 16)).astype(np.float32)
            C = rng.standard_normal((16, 16)).astype(np.float32)
            name = tile_name("nvcuda::wmma::precision::tf32", la, lb, 8)
            D = run_tile(mod, name, A, B, C, (24, 20, 16, 16), (la, lb, 0, 0), np.float32,
                         round_tf32)
            At, Bt = (rna_tf32(A), rna_tf32(B)) if round_tf32 else (chop(A), chop(B))
            np.testing.assert_array_equal(D, fp32_mma(At, Bt, C))
            assert np.abs(D - (A.astype(np.float64) @ B + C)).max() > 1e-6  # tf32 is not fp32


def test_fill_fragment_every_use():
    D, E = (aligned(np.full(256, np.nan, np.float32)) for _ in range(2))
    module().get_function("fills")((1,), (32,), (D, E, np.float32(1.5), np.float32(-0.25),
                                                 np.float32(3.0)))
    assert np.all(D == 16 * 1.5 * -0.25 + 3.0) and np.all(E == 3.0)


def test_layout_dependent_code_is_wrong_on_the_emulator():
    """The accumulator and matrix_a fragments have different layouts on the emulator (and no
    layout is promised on a GPU): copying x[i] across permutes the matrix."""
    rng = np.random.default_rng()
    C = aligned(rng.standard_normal(256).astype(np.float16).astype(np.float32))
    D = aligned(np.full(256, np.nan, np.float32))
    module().get_function("reuse_accumulator_as_a")(
        (1,), (32,), (C, aligned(np.eye(16, dtype=np.float16).reshape(-1)), D))
    assert not np.allclose(D, C)
    assert sorted(D.ravel()) == sorted(C.ravel())  # the same numbers, in other places


@pytest.mark.counted
@pytest.mark.parametrize("ctype", ["__half", "__nv_bfloat16", "float"])
@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (16, 16, 16), (33, 40, 50), (100, 17, 129)])
def test_wmma_gemm_matches_and_counts_exactly(ctype, M, N, K):
    name = f"wmma_gemm<{ctype}>"
    f = device.load("wmma_gemm.cu", name_expressions=(name,)).get_function(name)
    dt = {"float": np.float32, **TYPES}[ctype]
    rng = np.random.default_rng()
    A = rng.standard_normal((M, K)).astype(dt)
    B = rng.standard_normal((K, N)).astype(dt)
    C = np.full((M, N), np.nan, np.float32)
    launch = f((-(-N // 16), -(-M // 16)), (32,), (A, B, C, np.int32(M), np.int32(N), np.int32(K)))
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    if ctype == "float":  # tf32 inputs: relative error ~2^-11 per product
        A64, B64 = rna_tf32(A).astype(np.float64), rna_tf32(B).astype(np.float64)
    ref = A64 @ B64
    scale = np.sqrt(K) * 1e-6 + np.abs(ref).max() * 1e-6
    np.testing.assert_allclose(C, ref, rtol=0, atol=scale)
    model = traffic.wmma_gemm(M, N, K, ctype)
    assert {n: a.read_bytes for n, a in launch.args.items()} == model.read
    assert {n: a.write_bytes for n, a in launch.args.items()} == model.write
    assert {n: a.unique_read_bytes for n, a in launch.args.items()} == model.unique_read
    assert {n: a.unique_write_bytes for n, a in launch.args.items()} == model.unique_write
    assert launch.atomic_ops == 0 and launch.threads == 32 * -(-M // 16) * -(-N // 16)
