"""Resident blocks per SM where the occupancy calculator's two roundings matter: registers are
allocated per warp in units of REG_UNIT (256), and warps by registers in groups of WARP_UNIT (4,
one per SM sub-partition). Checked by hand on cases where dropping either rounding changes the
answer, then against an independent transcription of NVIDIA's rule (cuda_occupancy.h,
cudaOccMaxBlocksPerSMRegsLimit: each of the 4 sub-partitions holds 65536 / 4 registers, so
floor(16384 / registers a warp) warps; the SM 4 times that) over every block size and register
count a kernel can have."""

import pytest

from ckptlab.measure import occupancy, roofline

A100 = roofline.spec("a100")
H200 = roofline.spec("h200")


def res(registers, smem=0):
    return occupancy.Resources(registers, smem, "given by the test")


def test_register_rounding_by_hand():
    # 128 threads (4 warps) at 41 registers: 41 * 32 = 1312 a warp, allocated as 1536 (6 units);
    # 65536 / 1536 = 42 warps -> 40 (groups of 4) -> 10 blocks. Without the 256-register
    # rounding: 65536 / 1312 = 49 -> 48 warps -> 12 blocks.
    assert occupancy.resident_blocks(128, res(41), A100) == (10, "registers")
    # 256 threads (8 warps) at 33 registers: 1056 -> 1280 a warp; 51 -> 48 warps -> 6 blocks
    # (unrounded: 1056 a warp, 62 -> 60 warps -> 7 blocks).
    assert occupancy.resident_blocks(256, res(33), H200) == (6, "registers")


def test_warp_rounding_by_hand():
    # 64 threads (2 warps) at 200 registers: 6400 a warp (25 units exactly, so the register
    # rounding changes nothing); 65536 / 6400 = 10 warps -> 8 (groups of 4) -> 4 blocks.
    # Without the warp rounding: 10 warps -> 5 blocks.
    assert occupancy.resident_blocks(64, res(200), A100) == (4, "registers")
    # 32 threads at 168 registers: 5376 a warp (21 units); 12 warps, already a multiple of 4 ->
    # 12 blocks; at 176 registers: 5632 a warp (22 units), 11 warps -> 8 -> 8 blocks (not 11).
    assert occupancy.resident_blocks(32, res(168), A100) == (12, "registers")
    assert occupancy.resident_blocks(32, res(176), A100) == (8, "registers")


def calculator_blocks(threads, registers, spec):
    """Blocks per SM by NVIDIA's rules in cuda_occupancy.h's own form (registers per
    sub-partition), with the warp, block and shared memory (none here) limits; 0: no fit."""
    lim = occupancy.ARCH_LIMITS[spec["arch"]]
    warps = -(-threads // 32)
    per_warp = -(-registers * 32 // 256) * 256
    warps_per_sub_partition = lim["registers"] // 4 // per_warp
    by_registers = warps_per_sub_partition * 4 // warps
    by_warps = lim["threads"] // 32 // warps
    smem = spec["smem_per_sm_bytes"] // occupancy.SMEM_RESERVED
    return min(by_registers, by_warps, lim["blocks"], smem)


@pytest.mark.parametrize("spec", [A100, H200], ids=["a100", "h200"])
def test_every_block_size_and_register_count_as_the_calculator(spec):
    for threads in [*range(32, 1025, 32), 1, 33, 100, 200, 500, 1000]:
        for registers in range(1, 256):
            want = calculator_blocks(threads, registers, spec)
            if want == 0:
                with pytest.raises(ValueError, match="does not fit"):
                    occupancy.resident_blocks(threads, res(registers), spec)
                continue
            got, _ = occupancy.resident_blocks(threads, res(registers), spec)
            assert got == want, (threads, registers)
