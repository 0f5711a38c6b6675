"""The tensor-core backward checks `saved` as the fp32 one does (common.check_saved, one check
for every method and dtype): a truncated L or S, a missing O, an array of the wrong dtype or
layout is refused with what was expected, before anything is launched (a short L would be read
out of bounds on a GPU or in the emulator's fast mode; a short S gives NaN dQ)."""

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from ckptlab import device, emu, kernels
from ckptlab.kernels import flash_tc

DTYPES = [np.float16, ml_dtypes.bfloat16]


def inputs(dtype, B=1, H=2, Nq=19, Nk=13, d=16, seed=3):
    g = np.random.default_rng(seed)
    return tuple(g.standard_normal(s).astype(dtype)
                 for s in ((B, H, Nq, d), (B, H, Nk, d), (B, H, Nk, d), (B, H, Nq, d)))


def replace_tensor(saved, name, value):
    return dataclasses.replace(saved, tensors={**saved.tensors, name: value})


def drop(saved, name):
    return dataclasses.replace(saved, tensors={n: t for n, t in saved.tensors.items()
                                               if n != name})


SPOILS = [  # (methods, what is done to saved, error, message)
    (("flash", "stored"), lambda s: replace_tensor(s, "L", s.tensors["L"][:, :, :7].copy()),
     ValueError, r"saved L must have shape \(1, 2, 19\), got \(1, 2, 7\)"),
    (("stored",), lambda s: replace_tensor(s, "S", s.tensors["S"][:, :, :, :5].copy()),
     ValueError, r"saved S must have shape \(1, 2, 19, 13\)"),
    (("flash", "stored"), lambda s: drop(s, "O"), ValueError, r"saved holds \[.*\]; "
     r"\w+_backward reads \[.*'O'"),
    (("stored",), lambda s: drop(s, "S"), ValueError, r"stored_backward reads \['L', 'O', 'S'\]"),
    (("flash", "stored"), lambda s: replace_tensor(s, "L", s.tensors["L"].astype(np.float64)),
     TypeError, "saved L must have dtype float32"),
    (("flash", "stored"), lambda s: replace_tensor(s, "O", s.tensors["O"][:, :, ::-1]),
     ValueError, "saved O must be C-contiguous"),
    (("flash", "stored"), lambda s: replace_tensor(s, "O", s.tensors["O"].astype(np.float32)),
     TypeError, "saved O must have dtype (float16|bfloat16), got float32"),
    (("flash",), lambda s: dataclasses.replace(s, dropout_p=2.0), ValueError, "dropout_p"),
]
CASES = [(m, dt, *rest) for methods, *rest in SPOILS for m in methods for dt in DTYPES]


@pytest.mark.parametrize("method,dtype,spoil,error,message", CASES,
                         ids=[f"{c[0]}-{np.dtype(c[1]).name}-{c[4][:20]}" for c in CASES])
@pytest.mark.parametrize("entry", ["wrapper", "tc_backward"])
def test_saved_is_checked_before_any_launch(method, dtype, spoil, error, message, entry):
    q, k, v, dO = inputs(dtype)
    with device.use("emu"), emu.settings(mode="fast"):
        _, saved = getattr(kernels, f"{method}_forward")(q, k, v, causal=True)
        bad = spoil(saved)
        with emu.record() as rec, pytest.raises(error, match=message):
            if entry == "wrapper":
                getattr(kernels, f"{method}_backward")(dO, q, k, v, bad)
            else:
                flash_tc.tc_backward(dO, q, k, v, bad)
        assert rec.launches == []
        # the unspoiled state still runs (the check refuses only what is wrong)
        grads = getattr(kernels, f"{method}_backward")(dO, q, k, v, saved)
        assert all(np.isfinite(g.astype(np.float32)).all() for g in grads)


def test_a_saved_state_that_is_not_one_is_named():
    q, k, v, dO = inputs(np.float16)
    with device.use("emu"), pytest.raises(TypeError, match="saved must be what tc_forward "
                                                           "returned, got dict"):
        flash_tc.tc_backward(dO, q, k, v, {"O": q})
