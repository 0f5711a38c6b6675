"""Counted and unique bytes (the emulator) == modeled bytes (ckptlab.measure.traffic_tc),
exactly, for every launch and pointer argument of the tensor-core attention kernels; at the same
tiles the bf16 flash pair moves half the fp32 pair's bytes; the shared-memory sizes Python
computes are the kernels'."""

import ml_dtypes
import numpy as np
import pytest
from traffic_check import counted, counted_unique, inputs, modeled, modeled_unique

from ckptlab import device, emu, kernels
from ckptlab.kernels import flash_tc, table
from ckptlab.measure import traffic, traffic_tc

pytestmark = pytest.mark.counted  # every test here reads byte counts

DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


@pytest.fixture(autouse=True, scope="module")
def on_the_emulator():
    with device.use("emu"), emu.settings(mode="counted"):
        yield


SHAPES = [  # (B, H, Nq, Nk, d, causal, dtype)
    (1, 1, 1, 1, 8, False, "bfloat16"),
    (2, 1, 17, 40, 32, True, "float16"),
    (1, 2, 40, 17, 64, True, "bfloat16"),  # rows that see no key, key tiles no query sees
    (1, 1, 100, 70, 80, False, "float16"),
    (1, 1, 33, 50, 256, True, "bfloat16"),
]


@pytest.mark.parametrize("B,H,Nq,Nk,d,causal,dtype", SHAPES)
@pytest.mark.parametrize("method", ["flash", "stored"])
def test_counted_bytes_equal_the_model(B, H, Nq, Nk, d, causal, dtype, method):
    q, k, v, dO = inputs(B, H, Nq, Nk, d, DTYPES[dtype])
    with emu.record() as rec:
        _, saved = flash_tc.tc_forward(method, q, k, v, causal=causal, dropout_p=0.1, seed=3)
    model = traffic_tc.tc_forward_traffic(method, B, H, Nq, Nk, d, causal, dtype)
    assert counted(rec) == modeled(model)
    assert counted_unique(rec) == modeled_unique(model)
    for det in (False, True):
        with emu.record() as rec:
            flash_tc.tc_backward(dO, q, k, v, saved, deterministic=det)
        model = traffic_tc.tc_backward_traffic(method, B, H, Nq, Nk, d, causal, det, dtype)
        assert counted(rec) == modeled(model), f"deterministic={det}"
        assert counted_unique(rec) == modeled_unique(model), f"deterministic={det}"


def test_bf16_flash_moves_half_the_bytes_of_fp32_flash():
    """Same tiles (table.TC_*_TILES are the fp32 ones at d = 64), so only the element size
    changes: Q, K, V, O, dO and the gradients halve; L, D and the atomic dQ stay 4 bytes."""
    B, H, N, d = 1, 1, 96, 64
    q, k, v, dO = inputs(B, H, N, N, d, np.float32)
    assert table.TC_FWD_TILES[64] == kernels.FWD_TILES[64]
    assert table.TC_BWD_TILES[64] == kernels.BWD_TILES[64]
    with emu.record() as rec32:
        _, saved = kernels.flash_forward(q, k, v)
        kernels.flash_backward(dO, q, k, v, saved, deterministic=True)
    b16 = [x.astype(ml_dtypes.bfloat16) for x in (q, k, v, dO)]
    with emu.record() as rec16:
        _, saved = flash_tc.tc_forward("flash", *b16[:3])
        flash_tc.tc_backward(b16[3], *b16[:3], saved, deterministic=True)
    bytes32, bytes16 = (sum(x.global_read_bytes + x.global_write_bytes + x.atomic_bytes
                            for x in rec.launches) for rec in (rec32, rec16))
    model32 = traffic.totals(traffic.flash_forward_traffic(B, H, N, N, d) + traffic
                             .flash_backward_traffic(B, H, N, N, d, deterministic=True))
    model16 = traffic.totals(traffic_tc.tc_launches("flash", B, H, N, N, d, False, True))
    assert (bytes32, bytes16) == (model32["bytes"], model16["bytes"])
    ratio = bytes16 / bytes32
    assert 0.5 < ratio < 0.53, ratio  # half, plus the 4-byte L and D


SIZES = r"""
#include "tc_common.cuh"
template <class T, int Dt, int Br, int Bc>
__global__ void smem_sizes(int* out) {
    out[0] = FwdSmem<T, Dt, Br, Bc>::bytes;
    out[1] = BwdSmem<T, Dt, Br, Bc>::bytes;
    out[2] = DqSmem<T, Dt, Br, Bc>::bytes;
}
"""


def test_shared_memory_sizes_are_the_kernels():
    """table.tc_*_shared_bytes mirror tc_common.cuh's layouts: equal for every default tile."""
    configs = sorted({(Dt, *t) for Dt in table.TC_TILE_HEAD_DIMS
                      for t in (table.TC_FWD_TILES[Dt], table.TC_BWD_TILES[Dt])})
    names = [f"smem_sizes<__nv_bfloat16, {Dt}, {Br}, {Bc}>" for Dt, Br, Bc in configs]
    mod = emu.RawModule(code=SIZES, name="smem_sizes.cu", name_expressions=names,
                        options=(f"-I{device.KERNELS_DIR}",))
    for (Dt, Br, Bc), name in zip(configs, names, strict=True):
        out = np.zeros(3, np.int32)
        mod.get_function(name)((1,), (1,), (out,))
        assert out.tolist() == [table.tc_fwd_shared_bytes(Dt, Br, Bc),
                                table.tc_bwd_shared_bytes(Dt, Br, Bc),
                                table.tc_dq_shared_bytes(Dt, Br, Bc)], name
        assert max(out) <= table.TC_SHARED_MAX


def test_the_kernels_report_gets_the_dynamic_shared_memory():
    assert table.dynamic_shared_bytes("attn_flash_fwd_tc<__half, 64, 64, 32, false>") == \
        table.tc_fwd_shared_bytes(64, 64, 32)
    assert table.dynamic_shared_bytes("attn_flash_bwd_dkdv_tc<__nv_bfloat16, 256, 16, 16, "
                                      "true, false>") == table.tc_bwd_shared_bytes(256, 16, 16)
    assert table.dynamic_shared_bytes("attn_flash_fwd<64, 64, 32>") is None  # static only
