"""Launches the emulator must refuse, or run right, at its edges: pointer parameters past the
64th position, more pointer parameters than it tracks, long signatures, grid and block values
that are not integers, and a race check that would not fit in memory."""

import numpy as np
import pytest

from ckptlab import emu
from ckptlab.emu import abi, loader

pytestmark = pytest.mark.counted  # byte counts, bounds and race checks


def kernel_with(params: list[str], body: str, name: str = "k") -> emu.Kernel:
    code = (f'extern "C" __global__ void {name}({", ".join(params)}) {{ {body} }}\n')
    return emu.RawModule(code=code, name=f"{name}.cu").get_function(name)


def test_a_pointer_parameter_after_64_others_is_counted_right():
    params = [f"int i{j}" for j in range(70)] + ["float* out"]
    f = kernel_with(params, "out[threadIdx.x] = (float)(i0 + i69);", "late_pointer")
    out = np.zeros(4, np.float32)
    launch = f((1,), (4,), (*[np.int32(j) for j in range(70)], out))
    assert (out == 69).all()
    assert launch.args["out"].write_bytes == 16 and launch.args["out"].unique_write_bytes == 16


def test_the_64th_pointer_parameter_is_fine_the_65th_is_refused():
    ok = kernel_with([f"float* p{j}" for j in range(abi.MAX_ARGS)],
                     f"p{abi.MAX_ARGS - 1}[0] = 1.0f;", "many_ok")
    arrays = [np.zeros(1, np.float32) for _ in range(abi.MAX_ARGS)]
    launch = ok((1,), (1,), tuple(arrays))
    assert arrays[-1][0] == 1 and launch.args[f"p{abi.MAX_ARGS - 1}"].write_bytes == 4
    too_many = kernel_with([f"float* p{j}" for j in range(abi.MAX_ARGS + 1)], "p0[0] = 1.0f;",
                           "many_bad")
    arrays.append(np.zeros(1, np.float32))
    with pytest.raises(emu.EmuArgumentError, match=rf"65 pointer parameters.*at most "
                                                   rf"{abi.MAX_ARGS}"):
        too_many((1,), (1,), tuple(arrays))


def test_a_signature_over_1024_characters_is_read_whole():
    n = 45  # "const unsigned long long*," is 26 characters: 45 of them make 1170
    f = kernel_with([f"const unsigned long long* p{j}" for j in range(n)] + ["int* out"],
                    "out[0] = (int)p44[0];", "long_sig")
    assert len(",".join(f.param_types)) > 1024
    assert f.param_types == ["const unsigned long long*"] * n + ["int*"]
    out = np.zeros(1, np.int32)
    f((1,), (1,), (*[np.full(1, j, np.uint64) for j in range(n)], out))
    assert out[0] == 44


@pytest.mark.parametrize("grid,block,match", [
    ((1.9,), (1,), r"grid must be .*int.*got \(1.9,\)"),
    ("12", (1,), r"grid must be .*int.*got '12'"),
    ((1,), (32.0,), r"block must be .*int"),
    ((True,), (1,), r"grid must be .*int"),
    (None, (1,), r"grid must be .*int"),
    ((np.int64(2), np.int32(1)), (np.uint8(4),), None),  # NumPy integers are integers
])
def test_grid_and_block_must_be_integers(grid, block, match):
    f = kernel_with(["float* out"], "out[blockIdx.x * blockDim.x + threadIdx.x] = 1.0f;", "dims")
    out = np.zeros(8, np.float32)
    if match is None:
        f(grid, block, (out,))
        assert out.sum() == 8
    else:
        with pytest.raises(emu.EmuArgumentError, match=match):
            f(grid, block, (out,))


def test_race_check_refuses_a_launch_that_would_not_fit_in_memory(monkeypatch):
    """The race check keeps 32 bytes of shadow per 4 bytes of each argument (8x its size):
    refused with a clear error, before allocating, when that exceeds the available memory."""
    f = kernel_with(["const float* x", "float* y"], "y[threadIdx.x] = x[threadIdx.x];", "big")
    x, y = np.ones(1 << 20, np.float32), np.zeros(1 << 20, np.float32)
    need = loader.launch_memory_bytes([x, y], race_check=True)
    assert need >= 8 * (x.nbytes + y.nbytes)
    assert loader.launch_memory_bytes([x, y], race_check=False) < need
    monkeypatch.setattr(loader, "available_memory_bytes", lambda: need // 2)
    with pytest.raises(emu.EmuError, match=r"race check .*MiB.*race_check=False") as e:
        f((1,), (32,), (x, y))
    assert e.value.kind == "config"
    with emu.settings(race_check=False):  # what the message suggests works
        monkeypatch.setattr(loader, "available_memory_bytes", lambda: need)
        f((1,), (32,), (x, y))
    assert (y[:32] == 1).all()
