"""The tensor-core attention kernels under the emulator's race check (every kernel and variant,
tails, causal, opted-in shared memory), and the wrappers' errors: each bad input is refused
before anything runs, with a message that says what was expected and what came."""

import ml_dtypes
import numpy as np
import pytest

from ckptlab import device, emu
from ckptlab.kernels import flash_tc

pytestmark = pytest.mark.counted  # byte counts, bounds and race checks

BF16 = ml_dtypes.bfloat16


def inputs(B, H, Nq, Nk, d, dtype=BF16, seed=0):
    g = np.random.default_rng(seed)
    return tuple(g.standard_normal(s).astype(dtype)
                 for s in ((B, H, Nq, d), (B, H, Nk, d), (B, H, Nk, d), (B, H, Nq, d)))


@pytest.mark.parametrize("Nq,Nk,d,causal,dtype", [
    (70, 45, 24, True, BF16),         # tails everywhere; rows that see no key
    (33, 90, 64, False, np.float16),  # d = 64: 50 KiB of shared memory, opted in
    (20, 20, 200, True, BF16),        # Dt = 256: the dK/dV kernel at 85 KiB
])
def test_every_kernel_runs_race_free(Nq, Nk, d, causal, dtype):
    q, k, v, dO = inputs(1, 2, Nq, Nk, d, dtype)
    with device.use("emu"), emu.settings(mode="counted", race_check=True):
        for method in ("flash", "stored"):
            _, saved = flash_tc.tc_forward(method, q, k, v, causal=causal, dropout_p=0.1)
            for det in (False, True):
                grads = flash_tc.tc_backward(dO, q, k, v, saved, deterministic=det)
                assert all(np.isfinite(g.astype(np.float32)).all() for g in grads)


def test_wrong_inputs_are_refused_with_what_was_expected():
    q, k, v, dO = inputs(1, 1, 8, 8, 16)
    with device.use("emu"):
        with pytest.raises(TypeError, match="float16 or bfloat16.*got float32"):
            flash_tc.tc_forward("flash", q.astype(np.float32), k, v)
        with pytest.raises(TypeError, match=r"k must have the dtype of q \(bfloat16\), got f"):
            flash_tc.tc_forward("flash", q, k.astype(np.float16), v)
        with pytest.raises(ValueError, match="multiple of 8 in \\[8, 256\\].*d=12"):
            a = inputs(1, 1, 8, 8, 12)
            flash_tc.tc_forward("flash", *a[:3])
        with pytest.raises(ValueError, match="method must be one of"):
            flash_tc.tc_forward("naive", q, k, v)
        with pytest.raises(ValueError, match="tile Bc must be a multiple of 16"):
            flash_tc.tc_forward("flash", q, k, v, tiles=(16, 8))
        with pytest.raises(ValueError, match="at most .* fit every GPU"):
            flash_tc.tc_forward("flash", q, k, v, tiles=(512, 512))
        with pytest.raises(ValueError, match="C-contiguous"):
            flash_tc.tc_forward("flash", q, k.transpose(0, 1, 3, 2), v)
        O, saved = flash_tc.tc_forward("flash", q, k, v)
        with pytest.raises(TypeError, match=r"dO must have the dtype of q"):
            flash_tc.tc_backward(dO.astype(np.float16), q, k, v, saved)
        with pytest.raises(TypeError, match="saved holds a forward in bfloat16, but q is float16"):
            h = [x.astype(np.float16) for x in (dO, q, k, v)]
            flash_tc.tc_backward(*h, saved)
        with pytest.raises(ValueError, match="saved was made for"):
            b = inputs(1, 1, 9, 8, 16)
            flash_tc.tc_backward(b[3], *b[:3], saved)
        with pytest.raises(TypeError, match="deterministic must be a bool"):
            flash_tc.tc_backward(dO, q, k, v, saved, deterministic="yes")


def test_the_fp32_wrappers_hand_16bit_inputs_to_the_tensor_cores():
    """flash_forward / stored_forward (and kernels.forward / backward by name) take float16 and
    bfloat16 arrays and run the tensor-core pair: the same bits as flash_tc called directly."""
    from ckptlab import kernels

    q, k, v, dO = inputs(1, 2, 30, 41, 24, np.float16, seed=5)
    with device.use("emu"), emu.settings(mode="fast"):
        for method, fwd in (("flash", kernels.flash_forward), ("stored", kernels.stored_forward)):
            O, saved = fwd(q, k, v, causal=True)
            O_tc, saved_tc = flash_tc.tc_forward(method, q, k, v, causal=True)
            assert O.dtype == np.float16 and saved.method == method
            assert np.array_equal(O.view(np.uint16), O_tc.view(np.uint16))
            grads = kernels.backward(method, dO, q, k, v, saved, deterministic=True)
            want = flash_tc.tc_backward(dO, q, k, v, saved_tc, deterministic=True)
            for g, w in zip(grads, want, strict=True):
                assert g.dtype == np.float16 and np.array_equal(g.view(np.uint16),
                                                                w.view(np.uint16))
        _, saved = kernels.stored_forward(q, k, v)
        with pytest.raises(TypeError, match="saved must be what flash_forward returned, got "
                                            "stored"):
            kernels.flash_backward(dO, q, k, v, saved)
