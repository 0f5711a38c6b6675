"""The time model against hand computations: occupancy from registers, shared memory and threads;
waves; the launch cost; launch shapes against what the emulator launched; the compiler's report
against the tile table; and the fallback when no compiler is there."""

import math

import pytest

from ckptlab import emu, kernels
from ckptlab.kernels import nvrtc
from ckptlab.measure import occupancy, roofline, timemodel, traffic

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
    """geometry() against the emulator's record of every launch of all three methods: odd sizes,
    Nq != Nk, causal, a head dim padded to its tile head dim (d = 40 runs on Dt = 64)."""
    B, H, Nq, Nk, d = 2, 3, 37, 53, 40
    q, k, v, dO = kernels.random_inputs(B, H, Nq, d, Nk=Nk)
    with emu.settings(mode="fast", race_check=False), emu.record() as rec:
        for method in kernels.METHODS:
            _, s = kernels.forward(method, q, k, v, causal=True)
            kernels.backward(method, dO, q, k, v, s, deterministic)
    assert len(rec.launches) == 8 + 2 * (4 if deterministic else 3)
    for x in rec.launches:
        blocks, threads = occupancy.geometry(x.kernel, B, H, Nq, Nk, d)
        assert (blocks, blocks * threads) == (x.blocks, x.threads), x.kernel
    with pytest.raises(ValueError, match="no launch shape"):
        occupancy.geometry("sgemm_tiled", 1, 1, 8, 8, 16)


@pytest.mark.skipif(not HAVE_COMPILER, reason="no CUDA compiler (NVRTC or nvcc) on this machine")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_compiler_report_agrees_with_the_tile_table(arch):
    """ptxas' static shared memory equals the tile table's formula for every kernel variant the
    wrappers launch at two tile head dims (flash and stored, both dQ modes), and for the
    extern "C" kernels; registers are what ptxas reports (1..255)."""
    for name in ("attn_flash_fwd.cu", "attn_flash_bwd.cu"):
        for kernel in kernels.table.instantiations(name, tile_dims=(16, 64)):
            r = occupancy.resources(kernel, arch)
            assert r.source.startswith("ptxas") and 0 < r.registers <= 255
            assert r.smem == occupancy.table_shared_bytes(kernel), kernel
    for kernel in ("attn_naive_scores", "attn_naive_softmax", "attn_naive_bwd_ds",
                   "attn_flash_bwd_preprocess"):
        assert occupancy.resources(kernel, arch).smem == occupancy.table_shared_bytes(kernel)


def test_without_a_compiler_it_falls_back_and_says_so(no_cuda_compiler):
    r = occupancy.resources("attn_flash_fwd<64, 64, 32, false>", "sm_80")
    assert r.registers is None and r.smem == kernels.flash_fwd_shared_bytes(64, 64, 32)
    assert r.source == occupancy.NO_COMPILER and "shared memory and threads" in r.source
    t = timemodel.launch_time("attn_flash_fwd<64, 64, 32, false>", 16, 512, 1e9, 1e6,
                              "a100")
    assert t.resident == 3 and t.limiter == "shared memory"  # 167936 // 42624
    assert t.resources == occupancy.NO_COMPILER


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


def test_launch_bytes_bracket_and_scale():
    """Per launch, unique <= counted for every method (an atomicAdd counts as a read-modify-
    write in both: 8 bytes an operation with no cache), and 16-bit elements halve every argument
    but L, D and the atomics. By hand, flash's forward at N = 64, d = 64 (one Q tile, so K and V
    are read once): Q, K, V, O 64 x 64 floats each and L 64 floats = 4 x 16384 + 256 bytes; at
    2 bytes an element 4 x 8192 + 256."""
    for method in timemodel.CHAIN:
        for kt in traffic.launches(method, 1, 2, 32, 48, 64, causal=True):
            b = timemodel.launch_bytes(kt)
            assert b["unique"] <= b["counted"], kt.kernel
            assert b["counted"] == kt.bytes + kt.atomic_bytes and b["unique"] == kt.unique_bytes
    (fwd,) = traffic.forward_traffic("flash", 1, 1, 64, 64, 64)
    assert timemodel.launch_bytes(fwd) == {"counted": 4 * 16384 + 256, "unique": 4 * 16384 + 256}
    assert timemodel.launch_bytes(fwd, "bf16") == {"counted": 4 * 8192 + 256,
                                                   "unique": 4 * 8192 + 256}
    with pytest.raises(ValueError, match="dtype"):
        timemodel.launch_bytes(fwd, "fp8")


def test_a_real_launch_by_hand():
    """attn_naive_scores at N = 64, d = 64 on an A100: 16 blocks of 256 threads; 8 resident per
    SM (2048 threads / 256; its <= 32 registers allow 8 too), slots 108 x 8 = 864, one wave,
    each block at 1/864 of the GPU. FLOPs 2 x 64^3 = 524288; counted bytes: Q and K read 4 times
    each (64 x 64 floats, once per tile column/row) and S written once: 147456. Memory wins:
    864/16 x 147456 / 2.039e12 = 3.905 us, plus the 3 us launch."""
    t = timemodel.method_time("naive", 1, 1, 64, 64, 64, "a100").launches["counted"][0]
    assert (t.kernel, t.blocks, t.threads, t.resident, t.slots, t.waves) == (
        "attn_naive_scores", 16, 256, 8, 864, 1)
    assert (t.flops, t.bytes, t.bound) == (524288, 147456, "memory")
    assert t.compute_s == pytest.approx(54 * 524288 / 19.5e12, rel=1e-12)
    assert t.seconds == pytest.approx(3e-6 + 54 * 147456 / 2.039e12, rel=1e-12)


@pytest.mark.gpu
def test_resources_and_occupancy_agree_with_the_driver():
    """On the GPU: the registers and shared memory the model reads from ptxas are what the
    loaded kernels report, and resident_blocks equals the driver's own occupancy calculator
    (cuOccupancyMaxActiveBlocksPerMultiprocessor) for the fused kernels at d = 64 and 128."""
    from ckptlab import device
    from ckptlab.kernels import table

    cp = device.xp("cuda")
    gpu = roofline.current_gpu()
    if gpu is None:
        pytest.skip("this GPU is not in roofline.SPECS: no arch or SM count to model it with")
    spec = roofline.spec(gpu)
    with device.use("cuda"):
        for d in (64, 128):
            for filename, name in [
                ("attn_flash_fwd.cu", table.fwd_name(d, *table.fwd_tiles(d), False)),
                ("attn_flash_bwd.cu", table.dkdv_name(d, *table.bwd_tiles(d), False, False)),
                ("attn_flash_bwd.cu", table.dkdv_name(d, *table.bwd_tiles(d), False, True)),
            ]:
                fn = device.load(filename, name_expressions=(name,)).get_function(name)
                res = occupancy.resources(name, spec["arch"])
                assert (fn.num_regs, fn.shared_size_bytes) == (res.registers, res.smem), name
                threads = occupancy.geometry(name, 1, 1, 1024, 1024, d)[1]
                driver = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
                    fn.ptr, threads, 0)
                assert occupancy.resident_blocks(threads, res, spec)[0] == driver, name


def test_the_output_says_where_resources_come_from(monkeypatch):
    """bench attention's note names the compiler's report, or says there was none."""
    from ckptlab.cli import bench_attention

    rows = bench_attention.sweep([32], B=1, H=1, d=16, progress=False, counted=False)
    note = bench_attention.model_note(rows)
    assert "registers and shared memory: " in note
    assert ("ptxas" in note) == HAVE_COMPILER

    def missing(*args, **kwargs):
        raise nvrtc.CompilerNotFound("no CUDA compiler here (test)")

    monkeypatch.setattr(nvrtc, "compile_file", missing)
    occupancy.resources.cache_clear()
    occupancy._compiled.cache_clear()
    try:
        assert occupancy.NO_COMPILER in bench_attention.model_note(rows)
    finally:
        occupancy.resources.cache_clear()
        occupancy._compiled.cache_clear()


def test_the_forward_and_backward_parts_add_up_to_the_whole():
    """method_time(part=...): the forward's launches and the backward's, each alone, sum to
    forward + backward at both bounds (lab 06 times the backward alone, atomic and
    deterministic dQ, with the same model as labs 05 and 08)."""
    for method, det in (("flash", False), ("flash", True), ("stored", False), ("naive", False)):
        kw = dict(deterministic=det)
        whole = timemodel.method_time(method, 1, 16, 1024, 1024, 32, "A100", **kw)
        fwd = timemodel.method_time(method, 1, 16, 1024, 1024, 32, "A100", part="forward", **kw)
        bwd = timemodel.method_time(method, 1, 16, 1024, 1024, 32, "A100", part="backward", **kw)
        assert fwd.lower + bwd.lower == pytest.approx(whole.lower, rel=1e-12)
        assert fwd.upper + bwd.upper == pytest.approx(whole.upper, rel=1e-12)
        assert all("_bwd" in x.kernel for x in bwd.launches["counted"])
        assert not any("_bwd" in x.kernel for x in fwd.launches["counted"])
    with pytest.raises(ValueError, match="part"):
        timemodel.method_time("flash", 1, 1, 64, 64, 32, "A100", part="dq")


def test_lab06_times_its_kernels_with_the_labs_time_model():
    """Lab 06 priced the backward with one roofline over its totals (no launch cost, no waves),
    another model than labs 05 and 08's, without saying so."""
    from lab_cells import code_cell

    cell = code_cell("06", "# The cost against N, the backward alone")
    assert "timemodel.method_time(" in cell and 'part="backward"' in cell
    assert "roofline.modeled_time(" not in cell
