"""Memory against speed where the bargain holds (ckptlab.measure.memory_speed): the saved-bytes
model equals what the wrappers' ledger holds, for every method, fp32 and the tensor-core pair;
the figure's size is one where every launch fills the waves and S exceeds the L2; and the figure
of bench attention and lab 05 is drawn there, never at the toy size with a title that says the
model means nothing there."""

import ml_dtypes
import numpy as np
import pytest

from ckptlab import kernels
from ckptlab.cli import attention_figures, bench_attention
from ckptlab.kernels import flash_tc
from ckptlab.measure import memory_speed, timemodel

GPUS = ("A100-SXM4-80GB", "H200-SXM-141GB")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("method", ["naive", "stored", "flash"])
def test_saved_bytes_model_equals_the_ledger(method, causal):
    B, H, N, d = 2, 3, 37, 40  # odd: tails everywhere, a padded head dim
    q, k, v, _ = kernels.random_inputs(B, H, N, d, seed=1)
    _, saved = kernels.forward(method, q, k, v, causal=causal)
    assert memory_speed.saved_bytes(method, B, H, N, d, causal) == saved.nbytes


@pytest.mark.parametrize("method", ["stored", "flash"])
def test_saved_bytes_model_of_the_tensor_core_pair(method):
    B, H, N, d = 1, 2, 45, 32
    g = np.random.default_rng(2)
    q, k, v = (g.standard_normal((B, H, N, d)).astype(ml_dtypes.bfloat16) for _ in range(3))
    _, saved = flash_tc.tc_forward(method, q, k, v)
    assert memory_speed.saved_bytes(method, B, H, N, d, dtype="bf16") == saved.nbytes
    fp32 = memory_speed.saved_bytes(method, B, H, N, d)
    assert memory_speed.saved_bytes("naive", B, H, N, d, dtype="bf16") == \
        memory_speed.saved_bytes("naive", B, H, N, d) // 2  # a what-if: P at 2 bytes
    assert memory_speed.saved_bytes(method, B, H, N, d, dtype="bf16") < fp32


def test_the_size_fills_the_waves_and_exceeds_the_l2():
    n = memory_speed.at_scale_size(GPUS, 64)
    assert n == 4096
    for gpu in GPUS:
        assert n >= timemodel.fills_waves_from(1, 16, 64, gpu)
        assert n >= timemodel.s_exceeds_l2_from(gpu, 1, 16)
    with pytest.raises(ValueError, match="method"):
        memory_speed.saved_bytes("fused", 1, 1, 8, 8)


def test_bench_attentions_figure_is_drawn_at_scale_with_the_counts_beside():
    """The default run (B = H = 1, N = 64, 128) is far from filling a wave: the figure models
    B = 1, H = 16, N = 4096 instead, says so, and checks the model against the counts."""
    rows = bench_attention.sweep([64, 128], B=1, H=1, d=64, gpus=GPUS, progress=False)
    fig = attention_figures.plot_memory_vs_speed(rows)
    title = fig._suptitle.get_text().replace("\n", " ")
    assert "N=4096, B=1 H=16 d=64" in title and "every count equals its model" in title, title
    for stale in ("means something", "not a prediction", "a guide"):
        assert stale not in title
    ax_t, ax_c = fig.axes
    assert "N=4096" in ax_t.get_title() and "N = 64, 128" in ax_c.get_title()
    at_scale = memory_speed.at_scale_points(1, 16, 4096, 64, GPUS)
    mem = {p["name"]: p["memory_bytes"] for p in at_scale}
    assert mem["flash"] * 60 < mem["stored"]  # O(N) against N x N

    text = bench_attention.format_table(rows, modeled_times=False)
    assert "modeled" not in text.split("forward + backward")[0] and "counted B" in text
