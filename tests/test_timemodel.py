"""The time model against hand computations: occupancy from registers, shared memory and threads;
waves; the launch cost; launch shapes against what the emulator launched; the compiler's report
against the tile table; and the fallback when no compiler is there."""

import math

import pytest

from ckptlab import emu, kernels
from ckptlab.kernels import nvrtc
from ckptlab.measure import occupancy, roofline, timemodel

A100 = roofline.spec("a100")
H200 = roofline.spec("h200")
HAVE_COMPILER = nvrtc.backend_available("nvrtc") or nvrtc.backend_available("nvcc")


def res(registers, smem):
    return occupancy.Resources(registers, smem, "given by the test")


def test_resident_blocks_by_hand():
    # attn_flash_fwd<64, 64, 32> on an A100: 512 threads (16 warps), 127 registers, 41600 B smem.
    # registers: ceil(127 * 32 / 256) * 256 = 4096 a warp; 65536 / 4096 = 16 warps -> 1 block;
    # threads: 2048 / 512 = 4; smem: 167936 / (41600 + 1024) = 3.94 -> 3; blocks: 32.
    assert occupancy.resident_blocks(512, res(127, 41600), A100) == (1, "registers")
    # The same block with 64 registers a thread: 2048 a warp, 32 warps -> 2 blocks; smem 3;
    # threads 4: registers still limit, at 2.
    assert occupancy.resident_blocks(512, res(64, 41600), A100) == (2, "registers")
    # 128 threads, 24 registers (attn_naive_softmax): registers allow 65536 / 768 = 85 warps ->
    # 84 (groups of 4) / 4 warps = 21 blocks; threads 2048 / 128 = 16: threads limit.
    assert occupancy.resident_blocks(128, res(24, 0), A100) == (16, "threads")
    # 32 threads, no smem, few registers: the 32-blocks-per-SM cap.
    assert occupancy.resident_blocks(32, res(16, 0), A100) == (32, "blocks")
    # Shared memory: 100 KiB a block on an H200 (228 KiB per SM): 233472 / 103424 = 2.
    assert occupancy.resident_blocks(64, res(32, 100 * 1024), H200) == (2, "shared memory")
    # Registers unknown (no compiler): only threads, blocks and shared memory count.
    assert occupancy.resident_blocks(512, res(None, 41600), A100) == (3, "shared memory")
    with pytest.raises(ValueError, match="does not fit"):
        occupancy.resident_blocks(1024, res(255, 0), A100)
    with pytest.raises(ValueError, match="threads"):
        occupancy.resident_blocks(2048, res(32, 0), A100)


def test_one_block_launch_costs_at_least_the_launch_and_its_share_of_the_gpu():
    # One block of 512 threads, 1 resident per SM: slots = 108 on an A100. Its 1e6 FLOPs run at
    # 1/108 of the fp32 peak: 108 * 1e6 / 19.5e12 = 5.538 us, plus the 3 us launch.
    t = timemodel.launch_time("k", 1, 512, 1e6, 1e3, "a100", res=res(127, 41600))
    assert (t.slots, t.waves, t.bound) == (108, 1, "compute")
    assert t.compute_s == pytest.approx(108 * 1e6 / 19.5e12, rel=1e-12)
    assert t.seconds == pytest.approx(3e-6 + 108 * 1e6 / 19.5e12, rel=1e-12)
    assert t.seconds >= timemodel.LAUNCH_S
    # an empty launch is the launch cost alone
    empty = timemodel.launch_time("k", 1, 32, 0, 0, "h200", res=res(16, 0))
    assert empty.seconds == timemodel.LAUNCH_S and empty.bound == "launch"


def test_the_decomposition_multiplies_out():
    # 1000 blocks, 2 resident: slots 216, waves ceil(1000 / 216) = 5. One wave moves
    # 216/1000 of 4e9 bytes at 2.039e12 B/s and does 216/1000 of 1e10 FLOPs at 19.5e12.
    t = timemodel.launch_time("k", 1000, 256, 1e10, 4e9, "a100", res=res(128, 0))
    assert (t.resident, t.slots, t.waves) == (2, 216, 5)
    compute = 0.216 * 1e10 / 19.5e12
    memory = 0.216 * 4e9 / 2.039e12
    assert t.compute_s == pytest.approx(compute) and t.memory_s == pytest.approx(memory)
    assert t.bound == "memory"
    assert t.seconds == pytest.approx(3e-6 + 5 * max(compute, memory), rel=1e-12)
    # When the blocks fill whole waves it is the plain roofline plus the launch cost.
    full = timemodel.launch_time("k", 4 * 216, 256, 1e10, 4e9, "a100", res=res(128, 0))
    plain = roofline.modeled_time(1e10, 4e9, "a100")
    assert full.seconds == pytest.approx(3e-6 + plain.seconds, rel=1e-12)


def test_modeled_times_carry_their_label_and_sources():
    t = timemodel.launch_time("k", 3, 64, 1, 1, "h200", res=res(32, 0))
    assert t.source == "modeled" and t.device == "H200-SXM-141GB"
    assert "http" in timemodel.LAUNCH_SOURCE and "http" in occupancy.OCCUPANCY_SOURCE
    assert set(occupancy.ARCH_LIMITS) == {s["arch"] for s in roofline.SPECS.values()}


@pytest.mark.parametrize("deterministic", [False, True])
def test_launch_shapes_match_what_the_wrappers_launch(deterministic):
    """geometry() against the emulator's record of every launch: odd sizes, Nq != Nk, causal."""
    B, H, Nq, Nk, d = 2, 3, 37, 53, 32
    q, k, v, dO = kernels.random_inputs(B, H, Nq, d, Nk=Nk)
    with emu.settings(mode="fast", race_check=False), emu.record() as rec:
        _, s = kernels.flash_forward(q, k, v, causal=True)
        kernels.flash_backward(dO, q, k, v, s, deterministic=deterministic)
        _, s = kernels.naive_forward(q, k, v, causal=True)
        kernels.naive_backward(dO, q, k, v, s)
    assert len(rec.launches) == (4 if deterministic else 3) + 8
    for x in rec.launches:
        blocks, threads = occupancy.geometry(x.kernel, B, H, Nq, Nk, d)
        assert (blocks, blocks * threads) == (x.blocks, x.threads), x.kernel
    with pytest.raises(ValueError, match="no launch shape"):
        occupancy.geometry("sgemm_tiled", 1, 1, 8, 8, 16)


@pytest.mark.skipif(not HAVE_COMPILER, reason="no CUDA compiler (NVRTC or nvcc) on this machine")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_compiler_report_agrees_with_the_tile_table(arch):
    """ptxas' static shared memory equals the table's formula for every kernel but the
    deterministic dQ kernel, where the table gives the larger dK/dV kernel's (an upper bound)."""
    for name in ("attn_flash_fwd.cu", "attn_flash_bwd.cu"):
        for kernel in kernels.table.instantiations(name):
            r = occupancy.resources(kernel, arch)
            assert r.source.startswith("ptxas") and 0 < r.registers <= 255
            table = occupancy.table_shared_bytes(kernel)
            if "_dq<" in kernel:
                assert r.smem <= table, kernel
            else:
                assert r.smem == table, kernel
    for kernel in ("attn_naive_scores", "attn_naive_softmax", "attn_naive_bwd_ds",
                   "attn_flash_bwd_preprocess"):
        assert occupancy.resources(kernel, arch).smem == occupancy.table_shared_bytes(kernel)


def test_without_a_compiler_it_falls_back_and_says_so(monkeypatch):
    def missing(*args, **kwargs):
        raise nvrtc.CompilerNotFound("no CUDA compiler here (test)")

    monkeypatch.setattr(nvrtc, "compile_file", missing)
    monkeypatch.setattr(occupancy.build, "cache_dir", lambda: __import__("pathlib").Path(
        "/nonexistent-ckptlab-cache"))
    occupancy.resources.cache_clear()
    occupancy._compiled.cache_clear()
    try:
        r = occupancy.resources("attn_flash_fwd<64, 64, 32>", "sm_80")
        assert r.registers is None and r.smem == kernels.flash_fwd_shared_bytes(64, 64, 32)
        assert r.source == occupancy.NO_COMPILER and "shared memory and threads" in r.source
        t = timemodel.launch_time("attn_flash_fwd<64, 64, 32>", 16, 512, 1e9, 1e6, "a100")
        assert t.resident == 3 and t.limiter == "shared memory"  # 167936 // 42624
        assert t.resources == occupancy.NO_COMPILER
    finally:
        occupancy.resources.cache_clear()
        occupancy._compiled.cache_clear()


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="blocks"):
        timemodel.launch_time("k", 0, 32, 1, 1, "a100", res=res(16, 0))
    with pytest.raises(ValueError, match="flops"):
        timemodel.launch_time("k", 1, 32, -1, 1, "a100", res=res(16, 0))
    with pytest.raises(ValueError, match="arch"):
        occupancy.resources("attn_naive_scores", "sm_70")
    with pytest.raises(ValueError, match="no file"):
        occupancy.resources("attn_nosuch", "sm_80")
    assert math.isclose(timemodel.LAUNCH_S, 3e-6)
