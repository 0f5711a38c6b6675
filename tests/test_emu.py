"""The emulator runs ordinary .cu files correctly and counts their global bytes exactly.

The two example kernels (kernels/sgemm_tiled.cu, kernels/softmax_rows.cu) are checked against
float64 NumPy on fresh random inputs, odd sizes included, and their counted bytes against the
formulas in their headers. Small inline kernels check each CUDA feature the attention kernels
rely on (shuffles with width, votes, atomics, dynamic shared memory, templates, 3-D grids).
"""

import numpy as np
import pytest

from ckptlab import device, emu
from ckptlab.measure import traffic

pytestmark = pytest.mark.counted  # byte counts, bounds and race checks

TILE, ROWS_PER_BLOCK = 16, 4


def cdiv(a, b):
    return -(-a // b)


def rel_err(x, ref):
    return np.linalg.norm(np.asarray(x, np.float64) - ref) / max(np.linalg.norm(ref), 1e-300)


@pytest.fixture(scope="module")
def sgemm():
    with device.use("emu"):
        return device.load("sgemm_tiled.cu").get_function("sgemm_tiled")


@pytest.fixture(scope="module")
def softmax():
    with device.use("emu"):
        return device.load("softmax_rows.cu").get_function("softmax_rows")


def run_sgemm(f, A, B):
    M, K = A.shape
    N = B.shape[1]
    C = np.full((M, N), np.nan, np.float32)  # poisoned: an unwritten element fails
    launch = f((cdiv(N, TILE), cdiv(M, TILE)), (TILE, TILE),
               (A, B, C, np.int32(M), np.int32(N), np.int32(K)))
    return C, launch


@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (17, 33, 5), (64, 64, 64), (100, 37, 129)])
def test_sgemm_matches_float64_and_counts_exactly(sgemm, M, N, K):
    rng = np.random.default_rng()
    A = rng.standard_normal((M, K), dtype=np.float32)
    B = rng.standard_normal((K, N), dtype=np.float32)
    C, launch = run_sgemm(sgemm, A, B)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    assert rel_err(C, ref) < 1e-5  # fp32 accumulation over K <= 129 terms: ~1e-7
    # Bytes, from the kernel header: A read ceil(N/TILE) times, B ceil(M/TILE) times.
    assert launch.args["A"].read_bytes == M * K * 4 * cdiv(N, TILE)
    assert launch.args["B"].read_bytes == K * N * 4 * cdiv(M, TILE)
    assert launch.args["C"].write_bytes == M * N * 4
    assert launch.args["A"].write_bytes == launch.args["B"].write_bytes == 0
    assert launch.args["C"].read_bytes == 0 and launch.atomic_ops == 0
    model = traffic.sgemm_tiled(M, N, K)  # the modeled bytes the labs use: equal, exactly
    assert {n: a.read_bytes for n, a in launch.args.items()} == model.read
    assert {n: a.write_bytes for n, a in launch.args.items()} == model.write
    assert launch.threads == cdiv(M, TILE) * cdiv(N, TILE) * TILE * TILE
    # Shared memory, per thread and k-tile: 2 stores of 4 bytes, 2 * TILE loads of 4 bytes.
    steps = launch.threads * cdiv(K, TILE)
    assert launch.shared_write_bytes == steps * 2 * 4
    assert launch.shared_read_bytes == steps * 2 * TILE * 4


@pytest.mark.parametrize("R,C", [(1, 1), (5, 17), (33, 100), (8, 257)])
def test_softmax_rows_matches_float64_and_counts_exactly(softmax, R, C):
    rng = np.random.default_rng()
    x = (rng.standard_normal((R, C)) * 20).astype(np.float32)  # large scores: needs max-shift
    y = np.full_like(x, np.nan)
    launch = softmax((cdiv(R, ROWS_PER_BLOCK),), (32 * ROWS_PER_BLOCK,),
                     (x, y, np.int32(R), np.int32(C)))
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    ref = e / e.sum(axis=1, keepdims=True)
    assert rel_err(y, ref) < 1e-5
    assert launch.args["x"].read_bytes == 2 * R * C * 4  # online softmax: two passes over x
    assert launch.args["y"].write_bytes == R * C * 4
    assert launch.shared_read_bytes == launch.shared_write_bytes == 0  # all in shuffles
    model = traffic.softmax_rows(R, C)
    assert {n: a.read_bytes for n, a in launch.args.items()} == model.read
    assert {n: a.write_bytes for n, a in launch.args.items()} == model.write


def test_softmax_rows_with_masked_entries(softmax):
    """-inf entries (masked scores) anywhere in a row, the first columns included, give 0 there
    and a proper softmax of the rest; a row of only -inf gives zeros, never NaN."""
    rng = np.random.default_rng()
    R, C = 6, 70
    x = rng.standard_normal((R, C)).astype(np.float32)
    x[0, 0] = x[1, 5] = -np.inf  # in the first 32 columns: a lane's first value
    x[2, ::3] = -np.inf
    x[3, :40] = -np.inf  # a masked prefix longer than a warp
    x[4, :] = -np.inf
    y = np.full_like(x, np.nan)
    softmax((cdiv(R, ROWS_PER_BLOCK),), (32 * ROWS_PER_BLOCK,), (x, y, np.int32(R), np.int32(C)))
    assert not np.isnan(y).any()
    x64 = x[[0, 1, 2, 3, 5]].astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    assert rel_err(y[[0, 1, 2, 3, 5]], e / e.sum(axis=1, keepdims=True)) < 1e-5
    assert (y[4] == 0).all() and (y[np.isneginf(x)] == 0).all()


def test_fast_mode_gives_the_same_result_without_counts(sgemm):
    rng = np.random.default_rng()
    A = rng.standard_normal((33, 20), dtype=np.float32)
    B = rng.standard_normal((20, 18), dtype=np.float32)
    C1, counted = run_sgemm(sgemm, A, B)
    with emu.settings(mode="fast"):
        C2, fast = run_sgemm(sgemm, A, B)
    assert np.array_equal(C1, C2)  # same code, same order of operations
    assert counted.counted and not fast.counted and fast.args == {}


def test_record_collects_every_launch(sgemm, softmax):
    A = np.ones((16, 16), np.float32)
    x = np.zeros((4, 8), np.float32)
    with emu.record() as rec:
        run_sgemm(sgemm, A, A)
        softmax((1,), (128,), (x, np.empty_like(x), np.int32(4), np.int32(8)))
    assert [x.kernel for x in rec.launches] == ["sgemm_tiled", "softmax_rows"]
    assert rec.global_read_bytes == 2 * 16 * 16 * 4 + 2 * 4 * 8 * 4
    assert rec.by_kernel()["sgemm_tiled"]["C"].write_bytes == 16 * 16 * 4
    assert emu.last_launch() is rec.launches[-1]
    assert "softmax_rows" in rec.table()


# ---- CUDA features, each in a small kernel -------------------------------------------------
FEATURES = r"""
#include "common.cuh"
extern "C" __global__ void shuffles(const int* in, int* out, int width, int delta) {
    const int t = threadIdx.x, v = in[t];
    out[0 * 64 + t] = __shfl_sync(0xffffffffu, v, delta, width);
    out[1 * 64 + t] = __shfl_up_sync(0xffffffffu, v, delta, width);
    out[2 * 64 + t] = __shfl_down_sync(0xffffffffu, v, delta, width);
    out[3 * 64 + t] = __shfl_xor_sync(0xffffffffu, v, delta, width);
    out[4 * 64 + t] = (int)__ballot_sync(0xffffffffu, v % 3 == 0);
    out[5 * 64 + t] = __any_sync(0xffffffffu, v == 7);
    out[6 * 64 + t] = __all_sync(0xffffffffu, v >= 0);
    out[7 * 64 + t] = __syncthreads_count(v % 2);
}
extern "C" __global__ void atomics(const float* x, float* sum, int* hist, int* mx, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    atomicAdd(sum, x[i]);
    atomicAdd(&hist[i % 4], 1);
    atomicMax(mx, (int)(x[i] * 1000.0f));
}
extern "C" __global__ void dyn_reverse(const float4* x, float4* y, int n) {
    extern __shared__ float4 buf[];           // dynamic: size from shared_mem=
    const int t = threadIdx.x;
    if (t < n) buf[t] = x[t];                   // a 16-byte load, counted as 16 bytes
    __syncthreads();                            // buf complete before the reversed read
    if (t < n) y[t] = buf[n - 1 - t];
}
extern "C" __global__ void where_am_i(int* out) {
    const int bx = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const int tx = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const int nthreads = blockDim.x * blockDim.y * blockDim.z;
    out[bx * nthreads + tx] = bx * 10000 + tx;
}
template <int SCALE>
__global__ void scale_by(float* x, int n) {
    const int i = threadIdx.x;
    if (i < n) x[i] *= SCALE;
}
extern "C" __global__ void uninitialised_shared(float* out) {
    __shared__ float s[32];
    out[blockIdx.x * 32 + threadIdx.x] = s[threadIdx.x];   // never written: poisoned
}
"""


@pytest.fixture(scope="module")
def features():
    return emu.RawModule(code=FEATURES, options=(f"-I{device.KERNELS_DIR}",),
                         name="features.cu", name_expressions=["scale_by<3>", "scale_by<5>"])


def _expected_shuffles(v, width, delta):
    n, out = len(v), np.zeros((8, len(v)), np.int64)
    for j in range(n):
        seg = j - j % width
        out[0, j] = v[seg + delta % width]
        out[1, j] = v[j - delta] if j - delta >= seg else v[j]
        out[2, j] = v[j + delta] if j + delta < seg + width else v[j]
        out[3, j] = v[j ^ delta] if (j ^ delta) < seg + width else v[j]
        w = j - j % 32
        out[4, j] = sum(1 << i for i in range(32) if v[w + i] % 3 == 0)
        out[5, j] = int(any(v[w + i] == 7 for i in range(32)))
        out[6, j] = 1
        out[7, j] = int(sum(x % 2 for x in v))
    return out


@pytest.mark.parametrize("width,delta", [(32, 1), (32, 5), (16, 3), (8, 2), (4, 1), (2, 1)])
def test_shuffles_votes_and_syncthreads_count(features, width, delta):
    rng = np.random.default_rng()
    v = rng.integers(0, 100, 64).astype(np.int32)
    out = np.full(8 * 64, -1, np.int32)
    features.get_function("shuffles")((1,), (64,), (v, out, np.int32(width), np.int32(delta)))
    got = out.reshape(8, 64).astype(np.int64)
    got[4] &= 0xFFFFFFFF  # the ballot was stored as an int
    assert np.array_equal(got, _expected_shuffles(v, width, delta))


def test_atomics_are_counted_as_atomics(features):
    rng = np.random.default_rng()
    n = 203
    x = rng.random(n).astype(np.float32)
    s, hist, mx = np.zeros(1, np.float32), np.zeros(4, np.int32), np.full(1, -1, np.int32)
    launch = features.get_function("atomics")((cdiv(n, 64),), (64,), (x, s, hist, mx,
                                                                        np.int32(n)))
    assert abs(s[0] - x.astype(np.float64).sum()) < 1e-4
    assert hist.tolist() == [len(range(k, n, 4)) for k in range(4)]
    assert mx[0] == int((x * np.float32(1000)).astype(np.int32).max())
    assert (launch.args["sum"].atomic_ops, launch.args["hist"].atomic_ops,
            launch.args["mx"].atomic_ops) == (n, n, n)
    assert launch.args["sum"].atomic_bytes == 4 * n
    assert launch.args["sum"].read_bytes == launch.args["sum"].write_bytes == 0


@pytest.mark.parametrize("n", [1, 7, 64])
def test_dynamic_shared_memory_and_vector_loads(features, n):
    x = np.random.default_rng().random((n, 4)).astype(np.float32)
    y = np.full_like(x, np.nan)
    launch = features.get_function("dyn_reverse")((1,), (64,), (x, y, np.int32(n)),
                                                   shared_mem=64 * 16)
    assert np.array_equal(y, x[::-1])
    assert launch.args["x"].read_bytes == 16 * n and launch.args["y"].write_bytes == 16 * n
    assert launch.shared_write_bytes == 16 * n and launch.shared_read_bytes == 16 * n


def test_dynamic_shared_memory_over_48k_needs_the_attribute(features):
    f = features.get_function("dyn_reverse")
    x = np.zeros((4, 4), np.float32)
    with pytest.raises(emu.EmuError, match="max_dynamic_shared_size_bytes"):
        f((1,), (4,), (x, x.copy(), np.int32(4)), shared_mem=64 * 1024)
    f.max_dynamic_shared_size_bytes = 100 * 1024  # as on a GPU: opt in first
    f((1,), (4,), (x, x.copy(), np.int32(4)), shared_mem=64 * 1024)


@pytest.mark.parametrize("grid,block", [((3,), (5,)), ((2, 3), (4, 2)), ((2, 2, 3), (3, 2, 4)),
                                        ((1,), (1024,)), ((1, 1, 2), (2, 2, 64))])
def test_multidimensional_grids_and_blocks(features, grid, block):
    nb, nt = int(np.prod(grid)), int(np.prod(block))
    out = np.full(nb * nt, -1, np.int32)
    features.get_function("where_am_i")(grid, block, (out,))
    b, t = np.divmod(np.arange(nb * nt), nt)
    assert np.array_equal(out, b * 10000 + t)


def test_templates_through_name_expressions(features):
    for s in (3, 5):
        x = np.arange(10, dtype=np.float32)
        features.get_function(f"scale_by<{s}>")((1,), (16,), (x, np.int32(10)))
        assert np.array_equal(x, np.arange(10, dtype=np.float32) * s)
    with pytest.raises(AttributeError, match="scale_by<4>"):
        features.get_function("scale_by<4>")


def test_shared_memory_is_poisoned_before_each_block(features):
    out = np.zeros(64, np.float32)
    features.get_function("uninitialised_shared")((2,), (32,), (out,))
    assert np.isnan(out).all()


def test_parameters_are_read_from_the_source(features):
    assert features.get_function("atomics").params == [
        ("const float*", "x"), ("float*", "sum"), ("int*", "hist"), ("int*", "mx"),
        ("int", "n")]
    assert features.get_function("scale_by<3>").params == [("float*", "x"), ("int", "n")]


def test_device_module_is_cached_per_process():
    with device.use("emu"):
        assert device.load("sgemm_tiled.cu") is device.load("sgemm_tiled.cu")
        assert device.xp() is np


def test_shuffled_block_order_runs_every_block_once(features):
    out = np.full(6 * 4 * 2 * 8, -1, np.int32)
    with emu.settings(block_order="shuffled"):
        features.get_function("where_am_i")((6, 4, 2), (8,), (out,))
    b, t = np.divmod(np.arange(out.size), 8)
    assert np.array_equal(out, b * 10000 + t)


def test_shuffled_block_order_shows_atomic_nondeterminism(features):
    """One float accumulated by atomicAdd from many blocks: the order of the additions decides
    the rounding. Serial order gives the same bits every run; shuffled orders (as a GPU's
    scheduler may produce) give different bits, and a fixed block_seed repeats one order.
    With one worker: several workers interleave their atomics in no fixed order themselves,
    as a GPU's SMs do (test_emu_workers.py checks their sums)."""
    x = (np.random.default_rng(1).standard_normal(64 * 64) * 1e3).astype(np.float32)
    f = features.get_function("atomics")

    def total(**kw):
        s = np.zeros(1, np.float32)
        with emu.settings(workers=1, **kw):
            f((64,), (64,), (x, s, np.zeros(4, np.int32), np.zeros(1, np.int32),
                             np.int32(x.size)))
        return s[0]

    serial = {total() for _ in range(3)}
    shuffled = {total(block_order="shuffled") for _ in range(8)}
    seeded = {total(block_order="shuffled", block_seed=7) for _ in range(3)}
    assert len(serial) == 1 and len(seeded) == 1
    assert len(shuffled) > 1  # 8 random orders of 64 blocks: equal sums would be a fluke
    exact = x.astype(np.float64).sum()
    assert all(abs(v - exact) < 1e-3 * np.abs(x).sum() for v in shuffled)
