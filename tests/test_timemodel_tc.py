"""The time model at 16 bits: stored and flash are timed as the tensor-core kernels launch
(kernels/attn_flash_*_tc.cu through ckptlab.kernels.flash_tc), with traffic_tc's bytes, their
own launch shapes and their dynamic shared memory; naive, which has no tensor-core kernel, is a
what-if and says so. One launch is recomputed by hand from the A100's spec numbers."""

import ml_dtypes
import numpy as np
import pytest

from ckptlab import device, emu
from ckptlab.kernels import flash_tc, nvrtc, table
from ckptlab.measure import occupancy, roofline, timemodel, traffic_tc

A100 = roofline.spec("a100")
DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def inputs(B, H, Nq, Nk, d, dtype, seed=0):
    g = np.random.default_rng(seed)
    return tuple(g.standard_normal(s).astype(DTYPES[dtype])
                 for s in ((B, H, Nq, d), (B, H, Nk, d), (B, H, Nk, d), (B, H, Nq, d)))


@pytest.mark.parametrize("causal,deterministic,dtype,d", [
    (True, False, "bfloat16", 40), (False, True, "float16", 80)])
def test_tc_launch_shapes_match_what_flash_tc_launches(causal, deterministic, dtype, d):
    """geometry() against the emulator's record of every tensor-core launch of both methods:
    odd sizes, Nq != Nk, head dims padded to their tile head dim (d = 40 runs on Dt = 64, d = 80
    on Dt = 96, whose tiles have Br != Bc: forward (64, 16), backward (16, 32))."""
    B, H, Nq, Nk = 2, 3, 37, 53
    q, k, v, dO = inputs(B, H, Nq, Nk, d, dtype)
    with device.use("emu"), emu.settings(mode="fast", race_check=False), emu.record() as rec:
        for method in flash_tc.METHODS:
            _, s = flash_tc.tc_forward(method, q, k, v, causal=causal)
            flash_tc.tc_backward(dO, q, k, v, s, deterministic)
    assert len(rec.launches) == 2 * 4
    assert all("_tc<" in x.kernel for x in rec.launches)
    for x in rec.launches:
        blocks, threads = occupancy.geometry(x.kernel, B, H, Nq, Nk, d)
        assert (blocks, blocks * threads) == (x.blocks, x.threads), x.kernel
    with pytest.raises(ValueError, match="no launch shape"):
        occupancy.geometry("attn_flash_fwd_tc<__half>", 1, 1, 8, 8, 16)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_16_bit_stored_and_flash_time_the_tc_launches_with_their_bytes(dtype, deterministic):
    """Per launch: the kernel timed is traffic_tc's (a _tc kernel), its FLOPs are traffic_tc's at
    the tensor-core peak, its bytes traffic_tc's unscaled (counted: reads + writes + 2 x 4 bytes
    an atomicAdd; unique: distinct bytes read and written, an atomically updated one both)."""
    B, H, N, d, gpu = 1, 2, 100, 80, "h200"
    for method in ("stored", "flash"):
        mt = timemodel.method_time(method, B, H, N, N, d, gpu, causal=True,
                                   deterministic=deterministic, dtype=dtype)
        assert not mt.what_if and mt.kernels == timemodel.KERNELS_NOTE["tc"]
        runs = traffic_tc.tc_launches(method, B, H, N, N, d, True, deterministic,
                                      timemodel.TC_DTYPES[dtype])
        ctype = table.TC_TYPES[timemodel.TC_DTYPES[dtype]]
        for bound in timemodel.BOUNDS:
            assert [x.kernel for x in mt.launches[bound]] == [kt.kernel for kt in runs]
        for lo, hi, kt in zip(mt.launches["unique"], mt.launches["counted"], runs, strict=True):
            assert "_tc<" in kt.kernel and f"<{ctype}" in kt.kernel
            counted = sum(kt.read.values()) + sum(kt.write.values()) + 2 * 4 * sum(
                kt.atomics.values())
            unique = (sum(kt.unique_read.values()) + sum(kt.unique_write.values())
                      + 2 * sum(kt.unique_atomic.values()))
            assert (hi.bytes, lo.bytes) == (counted, unique), kt.kernel
            assert hi.flops == lo.flops == kt.flops
            share = hi.slots / hi.blocks
            assert hi.compute_s == pytest.approx(share * kt.flops / roofline.peak_flops(
                gpu, dtype), rel=1e-12)
        stored_s = [kt for kt in runs if kt.read.get("S") or kt.write.get("S")]
        assert bool(stored_s) == (method == "stored")  # S moves (fp32) in stored only


def test_tc_resources_count_the_dynamic_shared_memory():
    """The tensor-core kernels' shared memory is dynamic (ptxas reports 0 static): occupancy
    adds the launch's bytes, with or without a compiler. The dK/dV kernel at Dt = 256 takes
    85504 bytes: one block per A100 SM (167936 // 86528), not the 32-block cap."""
    kernel = table.tc_names("__nv_bfloat16", 256)["dkdv_flash_False"]
    want = table.tc_bwd_shared_bytes(256, 16, 16)
    assert want == 85504 and occupancy.table_shared_bytes(kernel) == 0
    r = occupancy.resources(kernel, "sm_80")
    assert r.dynamic_smem == want and r.shared == r.smem + want
    assert occupancy.resident_blocks(32, r, A100) == (1, "shared memory")
    static_only = occupancy.Resources(r.registers, r.smem, r.source)
    assert occupancy.resident_blocks(32, static_only, A100)[0] > 1
    for name in table.tc_names("__half", 64).values():  # every role has a dynamic size, or none
        assert occupancy.table_dynamic_shared_bytes(name) == (
            table.dynamic_shared_bytes(name) or 0)


def test_tc_resources_without_a_compiler(no_cuda_compiler):
    kernel = table.tc_names("__nv_bfloat16", 64)["fwd_stored"]
    r = occupancy.resources(kernel, "sm_80")
    assert (r.registers, r.smem, r.source) == (None, 0, occupancy.NO_COMPILER)
    assert r.dynamic_smem == table.tc_fwd_shared_bytes(64, 64, 32) == 50176
    mt = timemodel.method_time("stored", 1, 16, 4096, 4096, 64, "a100", dtype="bf16")
    fwd = mt.launches["unique"][0]
    assert (fwd.resident, fwd.limiter) == (3, "shared memory")  # 167936 // 51200
    assert mt.resources == occupancy.NO_COMPILER


def test_naive_at_16_bits_is_a_what_if():
    for dtype in ("bf16", "fp16"):
        mt = timemodel.method_time("naive", 1, 1, 64, 64, 64, "a100", dtype=dtype)
        assert mt.what_if and mt.kernels.startswith("what-if")
        assert not any("_tc" in x.kernel for x in mt.launches["counted"])
    for method in ("naive", "stored", "flash"):  # fp32 times what runs
        mt = timemodel.method_time(method, 1, 1, 64, 64, 64, "a100")
        assert not mt.what_if and mt.kernels == timemodel.KERNELS_NOTE["fp32"]


def test_a_tc_launch_by_hand():
    """The bf16 flash forward attn_flash_fwd_tc<__nv_bfloat16, 64, 64, 32, false> at B = 1,
    H = 16, N = 4096, d = 64 on an A100 (spec: 108 SMs, 167936 B shared memory per SM, 312e12
    bf16 tensor FLOP/s, 2.039e12 B/s). Blocks: 4096 / 64 Q tiles x 16 = 1024 of 64 / 16 x 32 =
    128 threads. Shared memory: 50176 dynamic + 1024 reserved -> 167936 // 51200 = 3 a SM, the
    least of the limits (threads allow 2048 / 128 = 16, blocks 32, ptxas' 70 registers a thread
    65536 // 2304 // 4 = 7; unknown without a compiler); slots 108 x 3 = 324, waves
    ceil(1024 / 324) = 4, each block at 1/324 of the GPU. FLOPs: 64 x 128 tile pairs per
    head, 2 products of 2 x 64 x 32 x 64 each: 16 x 8192 x 524288. Unique bytes: Q, K, V, O
    4096 x 64 x 2 bytes each and L 4096 x 4, times 16."""
    mt = timemodel.method_time("flash", 1, 16, 4096, 4096, 64, "a100", dtype="bf16")
    t = mt.launches["unique"][0]
    assert t.kernel == "attn_flash_fwd_tc<__nv_bfloat16, 64, 64, 32, false>"
    assert (t.blocks, t.threads, t.resident, t.limiter) == (1024, 128, 3, "shared memory")
    assert (t.slots, t.waves) == (324, 4)
    flops = 16 * 64 * 128 * 2 * (2 * 64 * 32 * 64)
    nbytes = 16 * (4 * 4096 * 64 * 2 + 4096 * 4)
    assert (t.flops, t.bytes) == (flops, nbytes)
    compute, memory = 324 / 1024 * flops / 312e12, 324 / 1024 * nbytes / 2.039e12
    assert t.bound == "compute" and compute > memory
    assert t.seconds == pytest.approx(3e-6 + 4 * compute, rel=1e-12)


@pytest.mark.gpu
def test_tc_resources_and_occupancy_agree_with_the_driver():
    """On the GPU: the loaded tensor-core kernels' registers and (zero) static shared memory are
    ptxas' as the model reads them, and resident_blocks with the launch's dynamic shared memory
    equals the driver's occupancy calculator given the same dynamic bytes."""
    gpu = roofline.current_gpu()
    if gpu is None:
        pytest.skip("this GPU is not in roofline.SPECS: no arch or SM count to model it with")
    spec = roofline.spec(gpu)
    cp = device.xp("cuda")
    with device.use("cuda"):
        for Dt in (64, 256):
            names = table.tc_names("__nv_bfloat16", Dt)
            for role in ("fwd_flash", "dkdv_stored_False", "dq_flash"):
                name = names[role]
                filename = "attn_flash_fwd_tc.cu" if role.startswith("fwd") else \
                    "attn_flash_bwd_tc.cu"
                fn = device.load(filename, options=nvrtc.cuda_include_options(),
                                 name_expressions=(name,)).get_function(name)
                res = occupancy.resources(name, spec["arch"])
                assert (fn.num_regs, fn.shared_size_bytes) == (res.registers, res.smem), name
                if res.dynamic_smem > table.SHARED_LIMIT:  # opt in, as flash_tc does
                    fn.max_dynamic_shared_size_bytes = res.dynamic_smem
                threads = occupancy.geometry(name, 1, 1, 1024, 1024, Dt)[1]
                driver = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
                    fn.ptr, threads, res.dynamic_smem)
                assert occupancy.resident_blocks(threads, res, spec)[0] == driver, name
