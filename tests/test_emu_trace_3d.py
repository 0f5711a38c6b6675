"""The access trace of a launch with a 3-D grid and 3-D blocks of unequal sides: blockIdx and
threadIdx (x, y, z) go to the runtime's linear index x + X (y + Y z) and back, so that asking
for block (1, 2, 1) or thread (1, 0, 1) names the elements that block or thread wrote."""

import itertools

import numpy as np
import pytest

from ckptlab import emu

pytestmark = pytest.mark.counted

SRC = r"""
extern "C" __global__ void stamp(float* y) {
    // y has shape (Z, Y, X) = (gridDim.z blockDim.z, gridDim.y blockDim.y, gridDim.x blockDim.x)
    const int x = blockIdx.x * blockDim.x + threadIdx.x;
    const int yy = blockIdx.y * blockDim.y + threadIdx.y;
    const int z = blockIdx.z * blockDim.z + threadIdx.z;
    y[(z * gridDim.y * blockDim.y + yy) * gridDim.x * blockDim.x + x] = 1.0f;
}
"""
GRID, BLOCK = (2, 3, 2), (2, 3, 2)  # x, y, z; x != y, so a stride taken from the wrong axis shows
SHAPE = tuple(g * b for g, b in zip(GRID[::-1], BLOCK[::-1], strict=True))  # (Z, Y, X) = (4, 9, 4)


@pytest.fixture(scope="module")
def trace():
    y = np.zeros(SHAPE, np.float32)
    with emu.trace() as tr:
        emu.RawModule(code=SRC, name="stamp.cu").get_function("stamp")(GRID, BLOCK, (y,))
    assert (y == 1).all()
    return tr.last


def owner(z, y, x):
    """(blockIdx, threadIdx) of the thread that writes y[z, y, x], each as (x, y, z)."""
    return ((x // BLOCK[0], y // BLOCK[1], z // BLOCK[2]),
            (x % BLOCK[0], y % BLOCK[1], z % BLOCK[2]))


def test_every_element_names_its_block_and_thread(trace):
    a = trace["y"]
    for z, y, x in itertools.product(*map(range, SHAPE)):
        assert a.writers((z, y, x)) == [owner(z, y, x)]
        assert a.writers((z, y, x), by="block") == [owner(z, y, x)[0]]


def test_a_block_and_a_thread_of_it_by_their_xyz(trace):
    a = trace["y"]
    for b in itertools.product(*map(range, GRID)):
        want = np.zeros(SHAPE, bool)  # block (bx, by, bz) covers z in [2 bz, 2 bz + 2), ...
        want[b[2] * 2:b[2] * 2 + 2, b[1] * 3:b[1] * 3 + 3, b[0] * 2:b[0] * 2 + 2] = True
        assert np.array_equal(a.mask("write", block=b), want), b
    # thread (1, 0, 1) of block (1, 2, 1): x = 1*2 + 1 = 3, y = 2*3 + 0 = 6, z = 1*2 + 1 = 3
    assert a.elements("write", block=(1, 2, 1), thread=(1, 0, 1)) == [(3, 6, 3)]


def test_the_block_map_is_the_linear_block_index(trace):
    """block_map holds x + X (y + Y z) with (X, Y) = (2, 3); block_index inverts it."""
    bm = trace["y"].block_map("write")
    z, y, x = 3, 6, 3  # block (1, 2, 1): 1 + 2 * (2 + 3 * 1) = 11
    assert bm[z, y, x] == 11 and trace.block_index(11) == (1, 2, 1)
    for lin in range(GRID[0] * GRID[1] * GRID[2]):
        bx, by, bz = trace.block_index(lin)
        assert bx + GRID[0] * (by + GRID[1] * bz) == lin
    assert trace.thread_index(1 + 2 * (0 + 3 * 1)) == (1, 0, 1)
