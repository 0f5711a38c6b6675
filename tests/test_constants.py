"""A constant C++ and Python share is written once: Python reads it from the header (ckptlab.cdefs)
or mirrors it and this file checks the mirror. These tests fail when the two sides differ."""

import ctypes
import re

import numpy as np
import pytest

from ckptlab import cdefs, device, emu, rng
from ckptlab.emu import abi
from ckptlab.kernels import table

KERNELS = device.KERNELS_DIR


def test_cdefs_reads_defines_and_enums(tmp_path):
    h = tmp_path / "x.h"
    h.write_text("#define A 16  // a comment\n#define B (48 * 1024)\n#define C 0x1Fu\n"
                 "#define NOT_A_NUMBER foo(1)\n/* #define HIDDEN 3 */\n"
                 "enum E { X = 1, Y = 7,  // note\n Z = 0x10 };\n")
    assert cdefs.read(h) == {"A": 16, "B": 49152, "C": 31, "X": 1, "Y": 7, "Z": 16}
    with pytest.raises(KeyError, match="defines no integer constant 'D'"):
        cdefs.constant(h, "D")
    with pytest.raises(FileNotFoundError):
        cdefs.read(tmp_path / "missing.h")


def test_philox_constants_mirror_the_kernels_header():
    """rng.py (NumPy) and kernels/philox.cuh (CUDA) must run the same function bit for bit."""
    h = cdefs.read(KERNELS / "philox.cuh")
    assert (h["PHILOX_M0"], h["PHILOX_M1"]) == (int(rng._M0), int(rng._M1))
    assert (h["PHILOX_W0"], h["PHILOX_W1"]) == (int(rng._W0), int(rng._W1))
    assert h["PHILOX_ROUNDS"] == rng.ROUNDS


def test_tiles_come_from_the_kernels_headers():
    common = cdefs.read(KERNELS / "common.cuh")
    assert (table.LANES, table.WARP, table.NAIVE_TILE) == (
        common["LANES"], common["WARP"], common["NAIVE_TILE"])
    assert table.SGEMM_TILE == cdefs.constant(KERNELS / "sgemm_tiled.cu", "TILE")
    assert table.SHARED_LIMIT == abi.SHARED_STATIC_LIMIT


def test_no_python_module_writes_the_shared_limits_by_hand():
    """48 KiB and 227 KiB appear only in abi.h (comments aside)."""
    from pathlib import Path

    import ckptlab

    hits = []
    for p in Path(ckptlab.__file__).parent.rglob("*"):
        if p.suffix not in (".py", ".cpp", ".h") or p.name == "abi.h":
            continue
        code = re.sub(r"#[^\n]*|//[^\n]*|\"[^\"\n]*\"", "", p.read_text())  # drop comments/strings
        if re.search(r"\b(48|227)\s*\*\s*1024\b|\b(49152|232448)\b", code):
            hits.append(p.name)
    assert not hits, f"shared-memory limits written by hand in {hits}: use emu/abi.h"


def test_fault_and_warp_codes_are_read_from_abi_h():
    c = cdefs.read(abi.HEADER)
    assert abi.FAULT_NAMES == {c[k]: k[6:].lower() for k in c if k.startswith("EMU_F_")
                               and k != "EMU_F_NONE"}
    assert set(abi.FAULT_NAMES.values()) >= {"barrier", "warp", "access", "race", "stack",
                                             "signal", "watchdog", "interrupt", "trap",
                                             "config"}
    assert abi.WARP_OPS["EMU_SYNCWARP"] == 7 and abi.WARP_OPS["EMU_SHFL_IDX"] == 0


def test_a_built_module_has_the_same_abi():
    """The layout every built module reports (offsetof/sizeof in C++) equals the ctypes one."""
    mod = emu.RawModule(code='extern "C" __global__ void k(float* x) { x[0] = 1.0f; }',
                        name="abi_check.cu")
    lib, path = mod._library("counted")
    lib.emu_abi_layout.restype = ctypes.c_char_p
    assert lib.emu_abi_layout().decode() == abi.layout()
    abi.check_library(lib, path)  # does not raise
    x = np.zeros(1, np.float32)
    mod.get_function("k")((1,), (1,), (x,))
    assert x[0] == 1.0


def test_an_abi_mismatch_is_refused():
    class Fake:
        class _F:
            restype = None

            def __init__(self, value):
                self.value = value

            def __call__(self):
                return self.value

        emu_abi_version = _F(abi.VERSION)
        emu_abi_layout = _F(abi.layout().replace("Fault.line@", "Fault.line@9").encode())

    with pytest.raises(abi.AbiMismatch, match="does not match"):
        abi.check_library(Fake(), "fake.so")
