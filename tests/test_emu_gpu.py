"""The emulator's example kernels on a real GPU through CuPy: same .cu files, same wrapper
code, results equal to float64 within the same tolerances, and close to the emulator's."""

import numpy as np
import pytest

from ckptlab import device, emu

pytestmark = pytest.mark.gpu
TILE = 16


def cdiv(a, b):
    return -(-a // b)


def rel_err(x, ref):
    return np.linalg.norm(np.asarray(x, np.float64) - ref) / max(np.linalg.norm(ref), 1e-300)


@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (17, 33, 5), (100, 37, 129), (512, 512, 512)])
def test_sgemm_on_the_gpu(M, N, K):
    cp = device.xp()
    rng = np.random.default_rng()
    A = rng.standard_normal((M, K), dtype=np.float32)
    B = rng.standard_normal((K, N), dtype=np.float32)
    C = cp.full((M, N), cp.nan, cp.float32)
    f = device.load("sgemm_tiled.cu").get_function("sgemm_tiled")
    f((cdiv(N, TILE), cdiv(M, TILE)), (TILE, TILE),
      (cp.asarray(A), cp.asarray(B), C, np.int32(M), np.int32(N), np.int32(K)))
    ref = A.astype(np.float64) @ B.astype(np.float64)
    assert rel_err(C.get(), ref) < 1e-5


@pytest.mark.parametrize("R,C", [(1, 1), (33, 100), (1000, 4097)])
def test_softmax_rows_on_the_gpu_matches_the_emulator(R, C):
    cp = device.xp()
    x = (np.random.default_rng().standard_normal((R, C)) * 20).astype(np.float32)
    y = cp.full((R, C), cp.nan, cp.float32)
    device.load("softmax_rows.cu").get_function("softmax_rows")(
        (cdiv(R, 4),), (128,), (cp.asarray(x), y, np.int32(R), np.int32(C)))
    with device.use("emu"):
        y_emu = np.full_like(x, np.nan)
        device.load("softmax_rows.cu").get_function("softmax_rows")(
            (cdiv(R, 4),), (128,), (x, y_emu, np.int32(R), np.int32(C)))
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    ref = e / e.sum(axis=1, keepdims=True)
    assert rel_err(y.get(), ref) < 1e-5 and rel_err(y_emu, ref) < 1e-5
    assert emu.last_launch().args["x"].read_bytes == 2 * R * C * 4
