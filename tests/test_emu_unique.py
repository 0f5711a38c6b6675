"""Unique bytes: the distinct bytes of each argument a launch reads and writes (what an infinite
cache would move), beside the counted requests (no cache). Small kernels whose unique bytes
follow from what they touch, then every kernel in kernels/ through its wrapper: unique never
exceeds counted, nor the argument's size."""

import numpy as np
import pytest

from ckptlab import device, emu, kernels

pytestmark = pytest.mark.counted  # byte counts, bounds and race checks

UNIQUE = r"""
extern "C" __global__ void read_one(const float* x, float* out) {
    out[threadIdx.x] = x[0];                       // 32 threads read the same 4 bytes
}
extern "C" __global__ void copy(const float* x, float* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
extern "C" __global__ void add_neighbour(float* x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;                       // read-modify-write
    __syncthreads();                               // every update of the block done
    const float v = i < n ? x[(i ^ 1) < n ? i ^ 1 : i] : 0.0f;  // a neighbour's
    __syncthreads();                               // every neighbour read before the writes
    if (i < n) x[i] += v;                          // read-modify-write again
}
extern "C" __global__ void every_other(const float* x, float* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (2 * i < n) y[i] = x[2 * i];                // half of x
}
extern "C" __global__ void histogram(const int* v, int* hist, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&hist[v[i] % 4], 1);      // 4 bins of 4 bytes, many atomics each
}
extern "C" __global__ void bytes_and_vectors(const unsigned char* c, const float4* f,
                                             float* out) {
    const int t = threadIdx.x;
    const float4 v = f[t % 2];                     // two float4s, 16-byte loads
    out[t] = (float)c[3 * t + 1] + v.x + v.y + v.z + v.w;  // and one byte in three
}
"""


@pytest.fixture(scope="module")
def mod():
    return emu.RawModule(code=UNIQUE, name="unique.cu")


def test_one_element_read_by_32_threads(mod):
    x, out = np.ones(8, np.float32), np.zeros(32, np.float32)
    a = mod.get_function("read_one")((1,), (32,), (x, out)).args
    assert a["x"].read_bytes == 32 * 4 and a["x"].unique_read_bytes == 4
    assert a["out"].write_bytes == a["out"].unique_write_bytes == 32 * 4
    assert a["x"].unique_write_bytes == a["out"].unique_read_bytes == 0


@pytest.mark.parametrize("n", [1, 17, 257])
def test_copy(mod, n):
    x, y = np.random.default_rng().random(n).astype(np.float32), np.full(n, np.nan, np.float32)
    launch = mod.get_function("copy")((-(-n // 64),), (64,), (x, y, np.int32(n)))
    assert np.array_equal(x, y)
    a = launch.args
    assert a["x"].unique_read_bytes == a["x"].read_bytes == 4 * n
    assert a["y"].unique_write_bytes == a["y"].write_bytes == 4 * n
    assert launch.global_unique_bytes == 8 * n
    assert launch.global_unique_read_bytes == launch.global_unique_write_bytes == 4 * n


def test_read_modify_write_counts_each_byte_once(mod):
    n = 100
    x = np.zeros(n, np.float32)
    a = mod.get_function("add_neighbour")((2,), (64,), (x, np.int32(n))).args["x"]
    assert (x == 2).all()
    assert (a.read_bytes, a.write_bytes) == (3 * 4 * n, 2 * 4 * n)
    assert (a.unique_read_bytes, a.unique_write_bytes) == (4 * n, 4 * n)


def test_a_strided_read_touches_half(mod):
    n = 257
    x, y = np.arange(n, dtype=np.float32), np.zeros(129, np.float32)
    a = mod.get_function("every_other")((3,), (64,), (x, y, np.int32(n))).args
    assert a["x"].unique_read_bytes == a["x"].read_bytes == 4 * 129
    assert np.array_equal(y, x[::2])


def test_atomics_count_as_read_and_written(mod):
    n = 203
    v = np.random.default_rng().integers(0, 1000, n).astype(np.int32)
    hist = np.zeros(4, np.int32)
    a = mod.get_function("histogram")((4,), (64,), (v, hist, np.int32(n))).args
    assert hist.tolist() == np.bincount(v % 4, minlength=4).tolist()
    bins = len(set((v % 4).tolist()))
    assert a["hist"].atomic_ops == n and a["hist"].atomic_bytes == 4 * n
    assert a["hist"].unique_read_bytes == a["hist"].unique_write_bytes == 4 * bins
    assert a["hist"].read_bytes == a["hist"].write_bytes == 0
    assert a["v"].unique_read_bytes == 4 * n


def test_byte_and_vector_granularity(mod):
    c = np.arange(3 * 32, dtype=np.uint8)
    f = np.arange(4 * 4, dtype=np.float32).reshape(4, 4)
    out = np.zeros(32, np.float32)
    a = mod.get_function("bytes_and_vectors")((1,), (32,), (c, f, out)).args
    assert a["c"].read_bytes == a["c"].unique_read_bytes == 32  # bytes 1, 4, 7, ...
    assert a["f"].read_bytes == 32 * 16 and a["f"].unique_read_bytes == 2 * 16
    assert np.array_equal(out, c[1::3].astype(np.float32) + f[np.arange(32) % 2].sum(axis=1))


def test_fast_mode_counts_nothing(mod):
    with emu.settings(mode="fast"):
        launch = mod.get_function("read_one")((1,), (32,), (np.ones(1, np.float32),
                                                            np.zeros(32, np.float32)))
    assert launch.args == {} and launch.global_unique_bytes == 0


def test_table_shows_unique_bytes(mod):
    x, out = np.ones(8, np.float32), np.zeros(32, np.float32)
    with emu.record() as rec:
        mod.get_function("read_one")((1,), (32,), (x, out))
        mod.get_function("read_one")((1,), (32,), (x, out))
    assert "unique read B" in rec.table() and "lower bound" in rec.table()
    assert rec.global_unique_read_bytes == 2 * 4 and rec.global_unique_write_bytes == 2 * 128
    assert rec.global_unique_bytes == 2 * (4 + 128)
    assert rec.by_kernel()["read_one"]["x"].unique_read_bytes == 8  # a sum over launches


# ---- every kernel of kernels/: unique <= counted, and <= the argument's size ------------------
def _check(rec, sizes):
    assert rec.launches
    for launch in rec.launches:
        for name, a in launch.args.items():
            where = f"{launch.kernel}: {name}"
            assert a.unique_read_bytes <= a.read_bytes + a.atomic_bytes, where
            assert a.unique_write_bytes <= a.write_bytes + a.atomic_bytes, where
            assert a.unique_read_bytes <= sizes.get(name, np.inf), where
            assert a.unique_write_bytes <= sizes.get(name, np.inf), where
            # touched at all <=> at least one unique byte
            assert (a.unique_read_bytes > 0) == (a.read_bytes + a.atomic_bytes > 0), where
            assert (a.unique_write_bytes > 0) == (a.write_bytes + a.atomic_bytes > 0), where


@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (17, 33, 5), (100, 37, 129)])
def test_sgemm_reads_every_input_byte_once_at_least(M, N, K):
    f = device.load("sgemm_tiled.cu").get_function("sgemm_tiled")
    rng = np.random.default_rng()
    A, B = rng.random((M, K), np.float32), rng.random((K, N), np.float32)
    C = np.full((M, N), np.nan, np.float32)
    with emu.record() as rec:
        f((-(-N // 16), -(-M // 16)), (16, 16), (A, B, C, np.int32(M), np.int32(N), np.int32(K)))
    _check(rec, {"A": A.nbytes, "B": B.nbytes, "C": C.nbytes})
    a = rec.launches[0].args
    # C = A B uses every element of A and B and writes every element of C
    assert (a["A"].unique_read_bytes, a["B"].unique_read_bytes) == (A.nbytes, B.nbytes)
    assert a["C"].unique_write_bytes == C.nbytes


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("B,H,Nq,Nk,d", [(1, 1, 17, 17, 16), (1, 2, 40, 17, 32),
                                         (2, 1, 33, 100, 64)])
def test_attention_kernels_unique_at_most_counted(B, H, Nq, Nk, d, causal):
    rng = np.random.default_rng()
    q = rng.standard_normal((B, H, Nq, d), dtype=np.float32)
    k, v = (rng.standard_normal((B, H, Nk, d), dtype=np.float32) for _ in range(2))
    dO = rng.standard_normal((B, H, Nq, d), dtype=np.float32)
    with emu.record() as rec:
        _, saved = kernels.naive_forward(q, k, v, causal=causal, dropout_p=0.1, seed=1)
        kernels.naive_backward(dO, q, k, v, saved)
        for det in (False, True):
            _, saved = kernels.flash_forward(q, k, v, causal=causal, dropout_p=0.1, seed=1)
            kernels.flash_backward(dO, q, k, v, saved, deterministic=det)
    assert len({x.kernel.split("<")[0] for x in rec.launches}) >= 12
    q_, k_, row, nn = 4 * B * H * Nq * d, 4 * B * H * Nk * d, 4 * B * H * Nq, 4 * B * H * Nq * Nk
    sizes = {"Q": q_, "O": q_, "dO": q_, "dQ": q_, "K": k_, "V": k_, "dK": k_, "dV": k_,
             "L": row, "D": row, "S": nn, "P": nn, "dP": nn, "dS": nn}
    assert {n for x in rec.launches for n in x.args} <= set(sizes)
    _check(rec, sizes)
    sk = device.load("softmax_rows.cu").get_function("softmax_rows")
    x = rng.standard_normal((Nq, Nk), dtype=np.float32)
    y = np.full_like(x, np.nan)
    with emu.record() as rec:
        sk((-(-Nq // 4),), (128,), (x, y, np.int32(Nq), np.int32(Nk)))
    _check(rec, {"x": x.nbytes, "y": y.nbytes})
    assert rec.launches[0].args["x"].unique_read_bytes == x.nbytes
    assert rec.launches[0].args["y"].unique_write_bytes == y.nbytes
