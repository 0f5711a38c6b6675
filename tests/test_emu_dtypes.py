"""bfloat16 parameters on the emulator: ml_dtypes' type, imported only when a kernel takes it."""
import subprocess
import sys

import numpy as np
import pytest

from ckptlab import emu

SRC = r"""
#include <cuda_bf16.h>
extern "C" __global__ void twice_bf16(const __nv_bfloat16* x, float* y, int n) {
    int i = threadIdx.x;
    if (i < n) y[i] = 2.0f * __bfloat162float(x[i]);
}
"""


@pytest.fixture(scope="module")
def mod():
    return emu.RawModule(code=SRC, name="dtypes.cu")


def test_bfloat16_array_runs(mod):
    import ml_dtypes
    x = np.array([1.5, -3.0, 0.25], ml_dtypes.bfloat16)
    y = np.full(3, np.nan, np.float32)
    mod.get_function("twice_bf16")((1,), (4,), (x, y, np.int32(3)))
    np.testing.assert_array_equal(y, [3.0, -6.0, 0.5])


def test_float16_for_a_bfloat16_parameter_is_refused(mod):
    y = np.zeros(3, np.float32)
    with pytest.raises(TypeError, match=r"must have dtype bfloat16, got float16"):
        mod.get_function("twice_bf16")((1,), (4,), (np.zeros(3, np.float16), y, np.int32(3)))


def test_fp32_kernels_do_not_import_ml_dtypes():
    # importing ml_dtypes 0.7 takes about a second: a process that runs no bfloat16 kernel
    # (the tour, most labs) must not pay it
    code = ("import sys, numpy as np\n"
            "from ckptlab import device, emu, kernels, engine\n"
            "with device.use('emu'):\n"
            "    f = device.load('sgemm_tiled.cu').get_function('sgemm_tiled')\n"
            "a = np.ones((16, 16), np.float32); c = np.empty_like(a)\n"
            "f((1, 1), (16, 16), (a, a, c, np.int32(16), np.int32(16), np.int32(16)))\n"
            "assert c[0, 0] == 16, c[0, 0]\n"
            "print('ml_dtypes' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
