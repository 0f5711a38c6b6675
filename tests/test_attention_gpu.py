"""The attention kernel checks of test_attention.py, on the CUDA target (CuPy arrays, NVRTC).

Skipped, with the reason, on a machine without a CUDA device. Run with `pytest -m gpu`.
Same shapes and tolerances as on the emulator; on a GPU the atomic dQ really is
order-dependent, so it is only held to the tolerance, while the deterministic dQ must be
bitwise equal run to run.
"""

import numpy as np
import pytest

from ckptlab import device, kernels

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not device.cuda_available(),
                       reason="no CUDA device visible (cupy.cuda.is_available() is False)"),
]


@pytest.fixture(autouse=True, scope="module")
def on_the_gpu():
    if not device.cuda_available():
        pytest.skip("no CUDA device visible")
    with device.use("cuda"):
        yield


@pytest.fixture(scope="module")
def cp():
    import cupy

    return cupy


def _cases():
    from test_attention import CASES, case_id

    return pytest.mark.parametrize("c", CASES, ids=case_id)


@_cases()
def test_kernels_match_float64_reference_on_gpu(c, cp):
    from test_attention import run_case

    run_case(c, xp=cp)


@_cases()
def test_atomic_dq_within_tolerance_run_to_run(c, cp):
    """Two atomic-dQ backwards may differ in the last bits (the order of the adds), but both
    are within the 1e-5 tolerance of float64 truth, as is the deterministic one."""
    from test_attention import TOL, make_inputs, rel

    from ckptlab import reference as ref

    B, H, Nq, Nk, d, causal, p = c
    q, k, v, dO = make_inputs(B, H, Nq, Nk, d, 11)
    dQ64 = ref.backward(dO, q, k, v, causal, None, p, seed=2, offset=0)[0]
    if np.linalg.norm(dQ64) == 0:
        pytest.skip("exact dQ is 0 (one key per row): covered by the zero bound elsewhere")
    qd, kd, vd, dOd = (cp.asarray(a) for a in (q, k, v, dO))
    for method in ("stored", "flash"):
        _, saved = kernels.forward(method, qd, kd, vd, causal=causal, dropout_p=p, seed=2)
        for deterministic in (False, False, True):
            dQ = kernels.backward(method, dOd, qd, kd, vd, saved, deterministic)[0]
            assert rel(cp.asnumpy(dQ), dQ64) <= TOL, method


def test_numpy_array_on_the_cuda_target_is_refused(cp):
    x = np.zeros((1, 1, 8, 16), np.float32)
    with pytest.raises(TypeError, match="cupy array on the 'cuda' target"):
        kernels.flash_forward(x, cp.asarray(x), cp.asarray(x))


@pytest.mark.parametrize("tiles", [(16, 32), (32, 8)])
def test_other_tile_sizes_on_gpu(tiles, cp):
    from test_attention import TOL, make_inputs, rel, truths

    q, k, v, dO = make_inputs(1, 2, 300, 170, 64, 4)
    O64, L64, g64 = truths(q, k, v, dO, True, 0.2, 9, 1, np.float64)
    qd, kd, vd, dOd = (cp.asarray(a) for a in (q, k, v, dO))
    for method in ("stored", "flash"):
        forward, backward = (getattr(kernels, f"{method}_{w}") for w in ("forward", "backward"))
        O, saved = forward(qd, kd, vd, causal=True, dropout_p=0.2, seed=9, offset=1,
                           tiles=tiles)
        assert rel(cp.asnumpy(O), O64) <= TOL
        for deterministic in (False, True):
            grads = backward(dOd, qd, kd, vd, saved, deterministic, tiles=tiles)
            for g, t in zip(grads, g64, strict=True):
                assert rel(cp.asnumpy(g), t) <= TOL, method


def test_every_head_dim_on_gpu(cp):
    """The head-dim cases of test_attention_head_dims.py (8..256, padded tiles) on the GPU,
    where the shared-memory budget and the registers are real."""
    from test_attention import run_case
    from test_attention_head_dims import HEAD_DIMS, case

    for n, d in enumerate(HEAD_DIMS):
        run_case(case(n, d), xp=cp, seed=n)
