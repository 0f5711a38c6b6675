"""Half precision, wmma and the tensor-core attention kernels on a real GPU (CuPy, NVRTC): the
emulator's claims checked against the chip. Skipped, with the reason, without a CUDA device;
run with `pytest -m gpu`.

  * conversions and 16-bit arithmetic: the GPU's bits equal the emulator's (CuPy compiles with
    -ftz=true, which flushes fp32 subnormals, so inputs below 2^-126 are left out);
  * wmma: every call and layout within fp32 rounding of float64; tf32 inputs the chip reads as
    the emulator says (the top 19 bits, rounded by __float_to_tf32 to nearest, ties away);
  * the GPU's fragment layout (printed; only layout-independent code may rely on none);
  * the wmma GEMM, and the attention pair on a few grid cases: FlashAttention's rule against
    PyTorch (where installed), and within a few 16-bit roundings of the emulator's answer.
"""

import ml_dtypes
import numpy as np
import pytest

from ckptlab import device, emu
from ckptlab.kernels import flash_tc

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not device.cuda_available(),
                       reason="no CUDA device visible (cupy.cuda.is_available() is False)"),
]


@pytest.fixture(autouse=True, scope="module")
def on_the_gpu():
    if not device.cuda_available():
        pytest.skip("no CUDA device visible")
    with device.use("cuda"):
        yield


def to_gpu(x):
    import cupy

    try:
        return cupy.asarray(x)
    except (TypeError, ValueError) as e:
        pytest.skip(f"this CuPy cannot hold {x.dtype} arrays: {e}")


def both(fn):
    """fn() on the GPU, then on the emulator: NumPy copies of what it returns."""
    gpu = [device.to_numpy(a) for a in fn()]
    with device.use("emu"), emu.settings(mode="fast"):
        cpu = [np.asarray(a) for a in fn()]
    return gpu, cpu


def test_conversions_and_arithmetic_match_the_emulator_bits():
    import test_half as th

    x = th.interesting_floats(np.random.default_rng(0))
    x = x[~(np.abs(x) < 2.0**-126) | (x == 0)]  # -ftz=true: no fp32 subnormal inputs
    n = x.size

    def run():
        outs = [device.xp().zeros(n, np.uint16) for _ in range(4)]
        th.module().get_function("from_float")((-(-n // 256),), (256,),
                                               (device.xp().asarray(x), *outs, np.int32(n)))
        return outs

    gpu, cpu = both(run)
    for g, c in zip(gpu, cpu, strict=True):
        np.testing.assert_array_equal(g, c)


def test_wmma_calls_and_tf32_on_the_gpu():
    import test_wmma as tw

    for ctype in tw.TYPES:
        tw.test_mma_every_layout_and_leading_dimension(ctype)
    names = [tw.tile_name("nvcuda::wmma::precision::tf32", "row_major", "row_major", 8)]
    mod = tw.module(tuple(names))
    g = np.random.default_rng(1)
    A, B = (g.standard_normal(s).astype(np.float32) for s in ((16, 8), (8, 16)))
    C = g.standard_normal((16, 16)).astype(np.float32)
    for round_tf32, prep in ((0, tw.chop), (1, tw.rna_tf32)):
        D = tw.run_tile(mod, names[0], A, B, C, (24, 20, 16, 16),
                        ("row_major", "row_major", 0, 0), np.float32, round_tf32)
        want = prep(A).astype(np.float64) @ prep(B).astype(np.float64) + C
        # fp32 summation order is the chip's own; truncation vs rounding differs by ~1e-3
        np.testing.assert_allclose(D, want, rtol=0, atol=2e-5 * np.abs(want).max())


def test_fragment_layout_of_this_gpu(capsys):
    import cupy

    f = device.load("wmma_fragment_map.cu",
                    options=flash_tc.cuda_include_options()).get_function("wmma_fragment_map")
    idx = np.arange(256, dtype=np.float32).reshape(16, 16)
    maps = [cupy.full((32, 16), np.nan, np.float32) for _ in range(3)]
    counts = cupy.zeros(3, np.int32)
    f((1,), (32,), (cupy.asarray(idx.astype(np.float16)), cupy.asarray(idx), *maps, counts))
    for name, m, c in zip(("matrix_a", "matrix_b", "accumulator"), maps, counts.get(),
                          strict=True):
        held = m.get()[:, :c]
        assert set(held.ravel().astype(int)) == set(range(256)), name  # every element held
        with capsys.disabled():
            print(f"\n{name}: {c} elements a lane; lane 0 holds {held[0].astype(int).tolist()}")


@pytest.mark.parametrize("ctype", ["__half", "__nv_bfloat16", "float"])
def test_wmma_gemm_on_the_gpu(ctype):
    name = f"wmma_gemm<{ctype}>"
    f = device.load("wmma_gemm.cu", options=flash_tc.cuda_include_options(),
                    name_expressions=(name,)).get_function(name)
    dt = {"__half": np.float16, "__nv_bfloat16": ml_dtypes.bfloat16, "float": np.float32}[ctype]
    M, N, K = 100, 17, 129
    g = np.random.default_rng(2)
    A, B = (g.standard_normal(s).astype(dt) for s in ((M, K), (K, N)))
    C = device.xp().full((M, N), np.nan, np.float32)
    f((-(-N // 16), -(-M // 16)), (32,), (to_gpu(A), to_gpu(B), C, np.int32(M), np.int32(N),
                                          np.int32(K)))
    ref = A.astype(np.float64) @ B.astype(np.float64)
    tol = 2e-3 if ctype == "float" else 1e-5  # tf32 rounds the inputs
    np.testing.assert_allclose(C.get(), ref, rtol=0, atol=tol * np.abs(ref).max())


CASES = [  # (B, H, Nq, Nk, d, causal, p, dtype): grid shapes, extra head dims, both dtypes
    (1, 2, 257, 64, 64, True, 0.0, "bfloat16"),
    (1, 1, 17, 100, 40, False, 0.2, "float16"),
    (1, 2, 100, 17, 160, True, 0.3, "bfloat16"),
    (1, 1, 64, 257, 256, False, 0.0, "float16"),
]


@pytest.mark.parametrize("c", CASES, ids=lambda c: "-".join(map(str, c)))
def test_attention_on_the_gpu(c):
    import test_attention_tc as ta

    B, H, Nq, Nk, d, causal, p, dtype = c
    npdt = ta.DTYPES[dtype][0]
    q, k, v, dO = ta.make_inputs(B, H, Nq, Nk, d, npdt, 0)
    kw = dict(causal=causal, dropout_p=p, seed=11, offset=7)

    def run():
        a = [to_gpu(x) if device.target() == "cuda" else x for x in (q, k, v, dO)]
        out = []
        for method in ("flash", "stored"):
            O, saved = flash_tc.tc_forward(method, *a[:3], **kw)
            out += [O, *flash_tc.tc_backward(a[3], *a[:3], saved, deterministic=True)]
        out += list(flash_tc.tc_backward(a[3], *a[:3], saved, deterministic=False))
        return out

    gpu, cpu = both(run)
    f64 = [x.astype(np.float64) for x in (q, k, v, dO)]
    truth = [ta.ref.forward(*f64[:3], **kw)[0], *ta.ref.backward(f64[3], *f64[:3], **kw)]
    truth = truth + truth + truth[1:]
    yard = ta.torch_low_precision(q, k, v, dO, causal, p, 11, 7, ta.DTYPES[dtype][1])
    yard = yard + yard + yard[1:]
    for n, (g, c_, t, y) in enumerate(zip(gpu, cpu, truth, yard, strict=True)):
        ta.check(f"output {n}", g, t, y)
        err_g = np.abs(g.astype(np.float64) - t).max()
        err_c = np.abs(c_.astype(np.float64) - t).max()
        slack = 2.0**-23 * np.abs(t).max()
        assert err_g <= 2 * err_c + slack, f"output {n}: GPU {err_g:.3e}, emulator {err_c:.3e}"
