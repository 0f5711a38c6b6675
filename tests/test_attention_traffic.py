"""Counted bytes (the emulator) == modeled bytes (ckptlab.measure.traffic), exactly, for every
launch and every pointer argument of the three methods; the flash backward holds and writes nothing
N x N; how bytes and saved memory grow with N."""

import tracemalloc

import numpy as np
import pytest
from traffic_check import counted, inputs, modeled

from ckptlab import device, emu, kernels
from ckptlab.measure import traffic

pytestmark = pytest.mark.counted  # byte counts, bounds and race checks


@pytest.fixture(autouse=True, scope="module")
def on_the_emulator():
    with device.use("emu"), emu.settings(mode="counted"):
        yield


SHAPES = [  # (B, H, Nq, Nk, d, causal, tiles or None); d = 40, 200: tiles padded to 64, 256
    (1, 1, 1, 1, 16, False, None),
    (1, 2, 30, 19, 40, True, None),
    (1, 1, 21, 9, 200, False, None),
    (2, 1, 17, 40, 32, True, None),
    (1, 2, 40, 17, 64, True, None),  # rows that see no key, key tiles no query sees
    (1, 1, 100, 100, 128, False, None),
    (1, 1, 64, 257, 16, True, None),
    (1, 1, 45, 70, 32, True, (16, 32)),
    (1, 1, 70, 45, 32, True, (32, 8)),
]


FUSED = {"stored": (traffic.stored_forward_traffic, traffic.stored_backward_traffic),
         "flash": (traffic.flash_forward_traffic, traffic.flash_backward_traffic)}


@pytest.mark.parametrize("B,H,Nq,Nk,d,causal,tiles", SHAPES)
def test_counted_bytes_equal_the_model(B, H, Nq, Nk, d, causal, tiles):
    q, k, v, dO = inputs(B, H, Nq, Nk, d)
    kw = dict(causal=causal, dropout_p=0.1, seed=3)
    Br, Bc = tiles or (None, None)
    with emu.record() as rec:
        _, saved = kernels.naive_forward(q, k, v, **kw)
    assert counted(rec) == modeled(traffic.naive_forward_traffic(B, H, Nq, Nk, d, causal))
    with emu.record() as rec:
        kernels.naive_backward(dO, q, k, v, saved)
    assert counted(rec) == modeled(traffic.naive_backward_traffic(B, H, Nq, Nk, d, causal))
    for method, (fwd_model, bwd_model) in FUSED.items():
        with emu.record() as rec:
            _, saved = kernels.forward(method, q, k, v, **kw, tiles=tiles)
        assert counted(rec) == modeled(fwd_model(B, H, Nq, Nk, d, causal, Br, Bc)), method
        for deterministic in (False, True):
            with emu.record() as rec:
                getattr(kernels, f"{method}_backward")(dO, q, k, v, saved, deterministic,
                                                       tiles=tiles)
            model = bwd_model(B, H, Nq, Nk, d, causal, deterministic, Br, Bc)
            assert counted(rec) == modeled(model), (method, deterministic)


def test_flash_backward_writes_and_holds_nothing_n_by_n():
    """Per-argument counters: no argument of a flash backward launch gets more than N x d
    bytes written (atomicAdds go to dQ only); tracemalloc: the flash backward allocates less
    than one N x N fp32 matrix, the naive one at least two (dP and dS). The ledger holds O and
    L only."""
    N, d = 257, 16
    nn = N * N * 4  # one N x N fp32 matrix: 264 KB, vs 16 KB for one N x d one
    q, k, v, dO = inputs(1, 1, N, N, d)
    _, flash = kernels.flash_forward(q, k, v)
    _, naive = kernels.naive_forward(q, k, v)
    assert flash.nbytes == N * (d + 1) * 4 and naive.nbytes == nn

    tracemalloc.start()
    with emu.record() as rec:
        kernels.flash_backward(dO, q, k, v, flash)
        kernels.flash_backward(dO, q, k, v, flash, deterministic=True)
    flash_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.reset_peak()
    kernels.naive_backward(dO, q, k, v, naive)
    naive_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert flash_peak < nn and naive_peak >= 2 * nn

    for launch in rec.launches:  # the atomic dQ adds land in dQ (N x d), Tc times over
        for name, a in launch.args.items():
            assert a.write_bytes <= N * d * 4, (launch.kernel, name)
            assert a.atomic_ops == 0 or name == "dQ", (launch.kernel, name)


def slope(ns, ys):
    """Exponent of y ~ N^slope: least-squares line through (log N, log y)."""
    return np.polyfit(np.log(ns), np.log(ys), 1)[0]


def test_growth_with_n():
    """Naive counted bytes grow ~N^2 (S, P, dP, dS live in HBM); the naive ledger (P) grows
    as N^2 and the flash ledger (O, L) as N."""
    ns, d = [32, 64, 128, 256], 16
    naive_bytes, naive_saved, flash_saved = [], [], []
    for N in ns:
        q, k, v, dO = inputs(1, 1, N, N, d)
        with emu.record() as rec:
            _, saved = kernels.naive_forward(q, k, v)
            kernels.naive_backward(dO, q, k, v, saved)
        naive_bytes.append(rec.global_read_bytes + rec.global_write_bytes + rec.atomic_bytes)
        naive_saved.append(saved.nbytes)
        with emu.settings(mode="fast"):  # only the ledger is needed here
            flash_saved.append(kernels.flash_forward(q, k, v)[1].nbytes)
    assert 1.9 <= slope(ns, naive_bytes) <= 2.05
    assert slope(ns, naive_saved) == pytest.approx(2.0, abs=1e-9)
    assert slope(ns, flash_saved) == pytest.approx(1.0, abs=1e-9)


def test_flops():
    """Model FLOPs count useful work; hardware FLOPs what runs, recompute listed apart.
    Non-causal with tiles dividing N: the flash backward is 10/8 = 1.25x the model (S
    recomputed), the deterministic one 14/8 (S and dO V^T recomputed again for dQ)."""
    B, H, N, d = 2, 3, 128, 64
    fwd = traffic.model_flops(B, H, N, N, d)
    assert fwd == 4 * B * H * N * N * d
    assert traffic.model_flops(B, H, N, N, d, backward=True) == 2 * fwd
    naive = traffic.totals(traffic.naive_forward_traffic(B, H, N, N, d)
                           + traffic.naive_backward_traffic(B, H, N, N, d))
    assert naive["flops"] == 3 * fwd and naive["recompute_flops"] == 0
    atomic = traffic.totals(traffic.flash_backward_traffic(B, H, N, N, d))
    det = traffic.totals(traffic.flash_backward_traffic(B, H, N, N, d, deterministic=True))
    assert atomic["flops"] == 2.5 * fwd and atomic["recompute_flops"] == 0.5 * fwd
    assert det["flops"] == 3.5 * fwd and det["recompute_flops"] == 1.5 * fwd
    # causal: the naive kernels still compute every pair; flash skips hidden tiles
    causal_model = traffic.model_flops(B, H, N, N, d, causal=True)
    naive_c = traffic.totals(traffic.naive_forward_traffic(B, H, N, N, d, causal=True))
    flash_c = traffic.totals(traffic.flash_forward_traffic(B, H, N, N, d, causal=True))
    assert naive_c["flops"] == fwd and causal_model < flash_c["flops"] < naive_c["flops"]
