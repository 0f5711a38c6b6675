"""The launch wrappers refuse what the kernels would misread, before any launch: a `saved`
whose arrays are not what the backward reads (a truncated L would be read out of bounds on a
GPU), NumPy masked arrays (the kernels would ignore the mask), a scale that fp32 cannot hold.
NaN and Inf in the inputs are not checked for: they propagate as the math does, which the
last tests show against the float64 reference."""

import dataclasses

import numpy as np
import pytest

from ckptlab import device, emu, kernels
from ckptlab import reference as ref


@pytest.fixture(autouse=True, scope="module")
def on_the_emulator():
    with device.use("emu"):
        yield


def inputs(B=1, H=2, Nq=9, Nk=11, d=16, seed=8):
    g = np.random.default_rng(seed)
    return tuple(g.standard_normal(s).astype(np.float32)
                 for s in ((B, H, Nq, d), (B, H, Nk, d), (B, H, Nk, d), (B, H, Nq, d)))


class _FakeCupy:
    """Stands in for a CuPy array (none can be made without a GPU)."""

    __module__ = "cupy._core.core"
    dtype, ndim, shape, nbytes = np.dtype(np.float32), 3, (1, 2, 9), 72


def replace_tensor(saved, name, value):
    return dataclasses.replace(saved, tensors={**saved.tensors, name: value})


SAVED_BAD = [  # (method, what is done to saved, error, message)
    ("flash", lambda s: replace_tensor(s, "L", s.tensors["L"][:, :, :5].copy()), ValueError,
     r"saved L must have shape \(1, 2, 9\), got \(1, 2, 5\)"),
    ("flash", lambda s: replace_tensor(s, "L", s.tensors["L"].astype(np.float64)), TypeError,
     "saved L must have dtype float32"),
    ("flash", lambda s: replace_tensor(s, "O", s.tensors["O"][:, :, ::-1]), ValueError,
     "saved O must be C-contiguous"),
    ("flash", lambda s: replace_tensor(s, "O", s.tensors["O"][0]), ValueError,
     r"saved O must have rank 4"),
    ("flash", lambda s: replace_tensor(s, "L", _FakeCupy()), TypeError,
     "saved L must be a numpy array on the 'emu' target"),
    ("flash", lambda s: dataclasses.replace(s, tensors={"O": s.tensors["O"]}), ValueError,
     r"saved holds \['O'\]; flash_backward reads \['L', 'O'\]"),
    ("naive", lambda s: replace_tensor(s, "P", s.tensors["P"][:, :, :, :-1].copy()), ValueError,
     r"saved P must have shape \(1, 2, 9, 11\)"),
    ("naive", lambda s: replace_tensor(s, "P", np.ma.masked_invalid(s.tensors["P"])), TypeError,
     "masked array"),
    ("flash", lambda s: dataclasses.replace(s, scale=1e39), ValueError, "scale"),
    ("flash", lambda s: dataclasses.replace(s, dropout_p=1.5), ValueError, "dropout_p"),
    ("naive", lambda s: dataclasses.replace(s, seed=-3), ValueError, "seed"),
]


@pytest.mark.parametrize("method,spoil,error,message", SAVED_BAD,
                         ids=[f"{b[0]}-{b[3][:24]}" for b in SAVED_BAD])
def test_saved_is_checked_before_any_launch(method, spoil, error, message):
    q, k, v, dO = inputs()
    _, saved = getattr(kernels, f"{method}_forward")(q, k, v)
    with emu.record() as rec, pytest.raises(error, match=message):
        getattr(kernels, f"{method}_backward")(dO, q, k, v, spoil(saved))
    assert rec.launches == []


@pytest.mark.parametrize("method", ["naive", "flash"])
@pytest.mark.parametrize("arg", ["q", "k", "v", "dO"])
def test_masked_arrays_are_refused(method, arg):
    """np.ma arrays are NumPy arrays whose mask the kernels would silently ignore."""
    args = dict(zip(("q", "k", "v", "dO"), inputs(), strict=True))
    args[arg] = np.ma.masked_greater(args[arg], 1.0)
    with emu.record() as rec, pytest.raises(TypeError, match=f"{arg} is a NumPy masked array"):
        if arg == "dO":
            _, saved = getattr(kernels, f"{method}_forward")(args["q"], args["k"], args["v"])
            rec.launches.clear()
            getattr(kernels, f"{method}_backward")(args["dO"], args["q"], args["k"], args["v"],
                                                   saved)
        else:
            getattr(kernels, f"{method}_forward")(args["q"], args["k"], args["v"])
    assert rec.launches == []


@pytest.mark.parametrize("method", ["naive", "flash"])
@pytest.mark.parametrize("scale,message", [
    (1e39, "overflows float32"), (-4e38, "overflows float32"), (1e-39, "float32's smallest normal"),
    (float("inf"), "finite"), (True, "finite number or None"),
])
def test_a_scale_fp32_cannot_hold_is_refused(method, scale, message):
    """1e39 is finite in float64 but inf in the kernels' fp32: every output would be NaN. A
    scale below fp32's smallest normal (1.18e-38) would be subnormal, flushed to 0 on a GPU
    that flushes denormals and not on the CPU."""
    q, k, v, _ = inputs()
    with emu.record() as rec, pytest.raises(ValueError, match=message):
        getattr(kernels, f"{method}_forward")(q, k, v, scale=scale)
    assert rec.launches == []


def test_fp32_extremes_of_scale_that_are_fine():
    q, k, v, _ = inputs()
    for scale in (0.0, float(np.finfo(np.float32).tiny), -0.25):
        O, _ = kernels.flash_forward(q, k, v, scale=scale)
        assert np.isfinite(O).all()


# ------------------------------------------------------------------------------ NaN and Inf


@pytest.mark.parametrize("method", ["naive", "flash"])
@pytest.mark.parametrize("where", ["q", "k", "v", "dO"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_and_inf_propagate_as_the_math_does(method, where, bad):
    """Not checked for (a pass over the data): one NaN or Inf in head 1 of an input makes
    exactly the outputs non-finite that the float64 reference makes non-finite (a bad query row
    poisons its O and dQ rows and, through dS, every dK and dV row; a bad key or value every
    row of the head), and head 0 stays finite and right: nothing leaks across heads. Inside
    head 1, where a NaN key makes a row's softmax normalizer NaN, the finite values left are
    not meaningful and differ between methods (flash's dV there is 0, naive's and the
    reference's unnormalized): kernels/__init__.py says so."""
    args = dict(zip(("q", "k", "v", "dO"), inputs(), strict=True))
    args[where][0, 1, 3, 5] = bad
    q, k, v, dO = args["q"], args["k"], args["v"], args["dO"]
    O, saved = getattr(kernels, f"{method}_forward")(q, k, v)
    grads = getattr(kernels, f"{method}_backward")(dO, q, k, v, saved)
    with np.errstate(invalid="ignore"):  # the reference's own inf - inf and 0 * inf
        O64, _ = ref.forward(q, k, v)
        g64 = ref.backward(dO, q, k, v)
    for name, got, want in zip(("O", "dQ", "dK", "dV"), (O, *grads), (O64, *g64), strict=True):
        got = device.to_numpy(got)
        assert np.array_equal(np.isfinite(got), np.isfinite(want)), name
        assert np.isfinite(got[:, 0]).all(), name
        assert np.allclose(got[:, 0], want[:, 0], rtol=1e-4, atol=1e-5), name
    assert (not np.isfinite(device.to_numpy(O[:, 1])).all()) == (where != "dO")
