"""Races the emulator's race check finds on global memory (across blocks, inside a block) and
through warp-level ordering, and the shared-memory limits of a GPU it enforces. Each fault is
an EmuError naming the kernel, block, thread and line; the process survives."""


import numpy as np
import pytest

from ckptlab import emu

pytestmark = pytest.mark.counted  # byte counts, bounds and race checks

# ---- races on global memory and warp-level ordering -----------------------------------------
GLOBAL_RACES = r"""
extern "C" __global__ void sum_without_atomics(const float* x, float* total) {
    total[0] += x[blockIdx.x * blockDim.x + threadIdx.x];   // lost updates on a GPU
}
extern "C" __global__ void sum_with_atomics(const float* x, float* total) {
    atomicAdd(total, x[blockIdx.x * blockDim.x + threadIdx.x]);
}
extern "C" __global__ void two_writers_one_block(float* y) {
    y[threadIdx.x / 2] = (float)threadIdx.x;                 // threads 2i and 2i+1 write y[i]
}
extern "C" __global__ void read_what_another_block_adds(float* y) {
    if (blockIdx.x == 0) atomicAdd(&y[0], 1.0f);
    else y[1] = y[0];                                        // plain read of an atomic target
}
extern "C" __global__ void barrier_orders_a_block(float* y) {
    if (threadIdx.x == 0) y[0] = 1.0f;
    __syncthreads();                                         // the write is visible to all
    y[1 + threadIdx.x] = y[0];
}
extern "C" __global__ void partial_syncwarp(float* out) {
    __shared__ float s[32];
    const int lane = threadIdx.x;
    if (lane < 8) {
        s[lane] = (float)lane;
        __syncwarp(0xffu);                                   // orders lanes 0-7 only
    }
    if (lane == 8) out[0] = s[0];                            // lane 8 took no part: a race
}
extern "C" __global__ void readers_then_syncwarp_then_write(float* out) {
    __shared__ float s[1];
    if (threadIdx.x == 0) s[0] = 1.0f;
    __syncwarp();
    out[threadIdx.x] = s[0];                                 // every lane reads s[0]
    __syncwarp();                                            // ... and then all of them sync
    if (threadIdx.x == 0) s[0] = 2.0f;                       // so this write races with none
    __syncwarp();
    out[32 + threadIdx.x] = s[0];
}
"""


@pytest.fixture(scope="module")
def races():
    return emu.RawModule(code=GLOBAL_RACES, name="races.cu")


def test_cross_block_accumulation_without_atomics_is_a_race(races):
    """`total[0] += x` from every thread: threads of one block race (caught at the second
    thread), and so do blocks of one thread each (caught at the second block)."""
    x = np.ones(4 * 32, np.float32)
    f = races.get_function("sum_without_atomics")
    with pytest.raises(emu.EmuError, match=r"global-memory race: this thread reads byte \+0 of "
                                           r"argument 'total', which thread \(0,0,0\) wrote "
                                           r".*races.cu:3") as info:
        f((4,), (32,), (x, np.zeros(1, np.float32)))
    assert info.value.kind == "race" and info.value.thread == (1, 0, 0)
    with pytest.raises(emu.EmuError, match=r"global-memory race: .*argument 'total'.* another "
                                           r"block .* in this launch") as info:
        f((4,), (1,), (x, np.zeros(1, np.float32)))
    assert info.value.block == (1, 0, 0)
    total = np.zeros(1, np.float32)
    races.get_function("sum_with_atomics")((4,), (32,), (x, total))  # the right way: no error
    assert total[0] == 128


def test_two_threads_of_a_block_writing_one_element(races):
    with pytest.raises(emu.EmuError, match=r"global-memory race: this thread writes byte \+0 of "
                                           r"argument 'y', which thread \(0,0,0\) wrote"):
        races.get_function("two_writers_one_block")((1,), (8,), (np.zeros(4, np.float32),))


def test_plain_read_of_what_another_block_updates_atomically(races):
    with pytest.raises(emu.EmuError, match=r"reads .* which another block updated atomically"):
        races.get_function("read_what_another_block_adds")((2,), (1,), (np.zeros(2, np.float32),))


def test_a_barrier_orders_global_memory_inside_a_block(races):
    y = np.zeros(33, np.float32)
    races.get_function("barrier_orders_a_block")((1,), (32,), (y,))
    assert (y == 1).all()


def test_a_partial_syncwarp_does_not_order_lanes_outside_its_mask(races):
    with pytest.raises(emu.EmuError, match=r"shared-memory race: this thread reads shared byte "
                                           r"\+0, which thread \(0,0,0\) wrote"):
        races.get_function("partial_syncwarp")((1,), (32,), (np.zeros(1, np.float32),))


def test_readers_of_one_warp_then_syncwarp_then_a_write_is_no_race(races):
    out = np.zeros(64, np.float32)
    races.get_function("readers_then_syncwarp_then_write")((1,), (32,), (out,))
    assert (out[:32] == 1).all() and (out[32:] == 2).all()


SYNCWARP_CHAINS = r"""
// lane 0 reads, a __syncwarp, lane 1 reads and then writes: on a GPU the __syncwarp orders
// lane 0's read before lane 1's write (kernels/attn_flash_fwd_tc.cu's wmma store meets this)
extern "C" __global__ void read_sync_read_write(float* out, int global) {
    __shared__ float s[1];
    float* x = global ? out : s;
    if (threadIdx.x == 0) x[0] = 1.0f;
    __syncwarp();
    if (threadIdx.x == 0) out[1] = x[0];
    __syncwarp();
    if (threadIdx.x == 1) { out[2] = x[0]; x[0] = 2.0f; }
}
// lanes 0 and 1 sync, then lanes 1 and 2: lane 0's read is ordered before lane 2's write
// through lane 1 (the ordering is transitive)
extern "C" __global__ void ordered_through_a_third_lane(float* out, int global) {
    __shared__ float s[1];
    float* x = global ? out : s;
    const int lane = threadIdx.x;
    if (lane == 0) out[1] = x[0];
    if (lane < 2) __syncwarp(0x3u);
    if (lane == 1) out[2] = x[0];
    if (lane == 1 || lane == 2) __syncwarp(0x6u);
    if (lane == 2) x[0] = 3.0f;
}
// lane 0 reads; lanes 0 and 1 sync; lane 1 reads; lane 2, which synced with nobody, writes
extern "C" __global__ void a_third_lane_outside_the_syncs(float* out, int global) {
    __shared__ float s[1];
    float* x = global ? out : s;
    if (threadIdx.x == 0) out[1] = x[0];
    if (threadIdx.x < 2) __syncwarp(0x3u);
    if (threadIdx.x == 1) out[2] = x[0];
    if (threadIdx.x == 2) x[0] = 3.0f;
}
"""


@pytest.fixture(scope="module")
def chains():
    return emu.RawModule(code=SYNCWARP_CHAINS, name="chains.cu")


@pytest.mark.parametrize("memory", ["shared", "global"])
def test_a_read_a_syncwarp_then_another_lanes_read_and_write_is_no_race(chains, memory):
    """Was a false alarm: the check kept one __syncwarp id for all readers (the latest read's),
    so lane 0's read looked unordered with lane 1's write."""
    out = np.zeros(4, np.float32)
    chains.get_function("read_sync_read_write")((1,), (32,), (out, np.int32(memory == "global")))
    assert out[1] == 1.0 and out[2] == 1.0 and (memory == "shared" or out[0] == 2.0)


@pytest.mark.parametrize("memory", ["shared", "global"])
def test_warp_ordering_is_transitive_through_a_third_lane(chains, memory):
    out = np.zeros(4, np.float32)
    chains.get_function("ordered_through_a_third_lane")(
        (1,), (32,), (out, np.int32(memory == "global")))
    assert memory == "shared" or out[0] == 3.0


@pytest.mark.parametrize("memory", ["shared", "global"])
def test_a_lane_outside_every_syncwarp_still_races_with_the_readers(chains, memory):
    """Folding ordered readers into the latest one must not hide a real race: lane 2 took part
    in no __syncwarp, so its write races with both reads."""
    with pytest.raises(emu.EmuError, match=rf"{memory}-memory race: this thread writes .*which "
                                           r"thread \(1,0,0\) read.*chains.cu:32") as info:
        chains.get_function("a_third_lane_outside_the_syncs")(
            (1,), (32,), (np.zeros(4, np.float32), np.int32(memory == "global")))
    assert info.value.thread == (2, 0, 0)


def test_dropping_the_atomic_from_the_flash_backward_is_caught():
    """The bug a learner makes when 'simplifying' FA2's dQ: += instead of atomicAdd. On the
    emulator the numbers would still be right (blocks run one by one), so only the race check
    stands between it and a GPU's lost updates."""
    from ckptlab import device, kernels

    src = device.kernel_source("attn_flash_bwd.cu")
    line = "atomicAdd(&dQ[(bh * Nq + q0 + ii) * d + col], scale * sq);"
    assert line in src  # the test edits exactly this line
    broken = src.replace(line, "dQ[(bh * Nq + q0 + ii) * d + col] += scale * sq;")
    name = kernels.table.dkdv_name(16, 32, 32, False, False)  # flash, atomic dQ
    mod = emu.RawModule(code=broken, options=(f"-I{device.KERNELS_DIR}",),
                        name="attn_flash_bwd.cu", name_expressions=[name])
    rng = np.random.default_rng()
    B, H, N, d = 1, 1, 40, 16
    q, k, v, dO = (rng.standard_normal((B, H, N, d), dtype=np.float32) for _ in range(4))
    _, saved = kernels.flash_forward(q, k, v)
    L = saved.tensors["L"]
    D = np.einsum("bhnd,bhnd->bhn", dO, saved.tensors["O"]).astype(np.float32)
    dQ, dK, dV = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    S = np.empty(0, np.float32)  # flash: no stored scores
    args = (q, k, v, dO, L, D, S, dQ, dK, dV, np.int32(N), np.int32(N), np.int32(d),
            np.float32(d ** -0.5), np.int32(0), np.uint64(0), np.uint64(0), np.uint32(0),
            np.float32(1))
    with pytest.raises(emu.EmuError, match=r"global-memory race: .*argument 'dQ'.*another block"):
        mod.get_function(name)((2, B * H), (kernels.LANES, 32), args)


SHARED_LIMITS = r"""
extern "C" __global__ void big_static(float* out) {
    __shared__ float s[16 * 1024 + 256];                     // 65 KiB: ptxas would refuse it
    s[threadIdx.x] = 1.0f;
    out[threadIdx.x] = s[threadIdx.x];
}
extern "C" __global__ void static_and_dynamic(float* out) {
    __shared__ float s[8 * 1024];                            // 32 KiB static
    extern __shared__ float dyn[];
    s[threadIdx.x] = 1.0f;
    dyn[threadIdx.x] = 2.0f;
    out[threadIdx.x] = s[threadIdx.x] + dyn[threadIdx.x];
}
"""


def test_shared_memory_over_a_gpus_limits():
    mod = emu.RawModule(code=SHARED_LIMITS, name="limits.cu")
    out = np.zeros(32, np.float32)
    with pytest.raises(emu.EmuError, match=r"shared memory over a GPU's limit: 66560 bytes "
                                           r"static.*48 KiB of static shared memory"):
        mod.get_function("big_static")((1,), (32,), (out,))
    f = mod.get_function("static_and_dynamic")
    f((1,), (32,), (out,), shared_mem=16 * 1024)  # 32 + 16 KiB: exactly the default limit
    assert (out == 3).all()
    with pytest.raises(emu.EmuError, match=r"32768 bytes static \+ 20480 dynamic"):
        f((1,), (32,), (out,), shared_mem=20 * 1024)
    f.max_dynamic_shared_size_bytes = 64 * 1024  # opting in, as on a GPU
    f((1,), (32,), (out,), shared_mem=20 * 1024)
