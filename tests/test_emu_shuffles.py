"""Shuffles on the emulator: every lane gets the value of the lane CUDA's rules name, for each
of the four shuffles, every width and any offset, and misuse (a width that is not a power of
two, a source lane outside the mask, lanes at different operations) is an EmuError."""

import numpy as np
import pytest

from ckptlab import emu

CODE = r"""
extern "C" __global__ void shuffles(const int* idx, const int* delta, const int* width,
                                    int* out, int n) {
    const int lane = threadIdx.x;
    for (int i = 0; i < n; ++i) {
        const int v = lane * 1000 + i, w = width[i];
        out[(i * 4 + 0) * 32 + lane] = __shfl_sync(0xffffffffu, v, idx[i], w);
        out[(i * 4 + 1) * 32 + lane] = __shfl_up_sync(0xffffffffu, v, delta[i], w);
        out[(i * 4 + 2) * 32 + lane] = __shfl_down_sync(0xffffffffu, v, delta[i], w);
        out[(i * 4 + 3) * 32 + lane] = __shfl_xor_sync(0xffffffffu, v, delta[i], w);
    }
}
extern "C" __global__ void bad_width(int* out, int w) {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1, w);
}
extern "C" __global__ void outside_mask(int* out) {
    if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(0x0000ffffu, 1, 20);
}
extern "C" __global__ void two_masks(int* out) {
    const unsigned mask = threadIdx.x < 16 ? 0xffffffffu : 0xffff0000u;
    out[threadIdx.x] = __shfl_sync(mask, 1, 0);
}
"""


def source_lane(op: str, j: int, arg: int, w: int) -> int:
    """CUDA's rule: lanes form segments of w; a source outside the segment keeps the lane's own
    value (up, down, xor); an index wraps modulo w."""
    seg = j - j % w
    if op == "idx":
        return seg + arg % w
    if op == "up":
        return j - arg if j - arg >= seg else j
    if op == "down":
        return j + arg if j + arg < seg + w else j
    return j ^ arg if (j ^ arg) < seg + w else j


@pytest.fixture(scope="module")
def mod():
    return emu.RawModule(code=CODE, name="shuffles.cu")


@pytest.mark.parametrize("mode", ["fast", "counted"])
def test_every_shuffle_every_width_any_offset(mod, mode):
    rng = np.random.default_rng()
    n = 24
    width = np.array([1, 2, 4, 8, 16, 32] * 4, np.int32)
    idx = rng.integers(-70, 70, n).astype(np.int32)
    delta = rng.integers(0, 40, n).astype(np.int32)
    out = np.full(n * 4 * 32, -1, np.int32)
    with emu.settings(mode=mode):
        mod.get_function("shuffles")((1,), (32,), (idx, delta, width, out, np.int32(n)))
    out = out.reshape(n, 4, 32)
    for i in range(n):
        for k, (op, arg) in enumerate((("idx", idx[i]), ("up", delta[i]), ("down", delta[i]),
                                       ("xor", delta[i]))):
            want = [source_lane(op, j, int(arg), int(width[i])) * 1000 + i for j in range(32)]
            assert out[i, k].tolist() == want, (op, int(arg), int(width[i]))


@pytest.mark.parametrize("w", [3, 0, 64])
def test_a_width_that_is_not_a_power_of_two_is_an_error(mod, w):
    with pytest.raises(emu.EmuError, match=rf"__shfl_xor_sync: width {w} is not a power of two"):
        mod.get_function("bad_width")((1,), (32,), (np.zeros(32, np.int32), np.int32(w)))


def test_a_source_lane_outside_the_mask_is_an_error(mod):
    with pytest.raises(emu.EmuError, match=r"lane 0 reads lane 20, which is not in the mask"):
        mod.get_function("outside_mask")((1,), (32,), (np.zeros(32, np.int32),))


def test_lanes_with_different_masks_are_an_error(mod):
    with pytest.raises(emu.EmuError, match=r"different warp operations: __shfl_sync \(mask "
                                           r"0xffffffff\).*__shfl_sync \(mask 0xffff0000\)"):
        mod.get_function("two_masks")((1,), (32,), (np.zeros(32, np.int32),))
