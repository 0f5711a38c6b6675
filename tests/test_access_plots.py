"""The access-map figure draws what the trace says: one image per argument whose values are the
block map (or the counts), one block's elements outlined by exact segments, one thread's marked,
a legend naming the blocks drawn, a title saying what is shown (and a truncated trace)."""

import numpy as np
import pytest
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.figure import Figure

from ckptlab import device, emu
from ckptlab.measure.access_plots import outline_segments, plot_access_map

pytestmark = pytest.mark.counted  # byte counts, bounds and race checks

M, N, K = 40, 24, 56  # lab 01's SGEMM size, 16 x 16 tiles: a grid of 2 x 3 blocks


@pytest.fixture(scope="module")
def sgemm():
    rng = np.random.default_rng(0)
    A = rng.standard_normal((M, K), dtype=np.float32)
    B = rng.standard_normal((K, N), dtype=np.float32)
    C = np.zeros((M, N), np.float32)
    with device.use("emu"):  # a module fixture runs before conftest pins each test's target
        f = device.load("sgemm_tiled.cu").get_function("sgemm_tiled")
        with emu.settings(mode="counted", race_check=False), emu.trace() as tr:
            f((2, 3), (16, 16), (A, B, C, np.int32(M), np.int32(N), np.int32(K)))
    return tr.last


def legend_texts(fig):
    return [t.get_text() for t in fig.legends[0].get_texts()]


def test_outline_segments_follow_the_border():
    m = np.zeros((4, 5), bool)
    m[1:3, 1:4] = True  # a 2 x 3 rectangle: 4 segments
    assert sorted(outline_segments(m)) == sorted([
        ((0.5, 0.5), (0.5, 2.5)), ((3.5, 0.5), (3.5, 2.5)),
        ((0.5, 0.5), (3.5, 0.5)), ((0.5, 2.5), (3.5, 2.5))])
    m[3, 3] = True  # a cell below the bottom-right one: an L of 6 sides, each one segment
    assert sorted(outline_segments(m)) == sorted([
        ((0.5, 0.5), (0.5, 2.5)), ((2.5, 2.5), (2.5, 3.5)), ((3.5, 0.5), (3.5, 3.5)),
        ((0.5, 0.5), (3.5, 0.5)), ((0.5, 2.5), (2.5, 2.5)), ((2.5, 3.5), (3.5, 3.5))])
    assert outline_segments(np.zeros((3, 3), bool)) == []


def test_which_block_wrote_each_element(sgemm, tmp_path):
    fig = plot_access_map(sgemm, "C", path=tmp_path / "c.png")
    assert isinstance(fig, Figure) and (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    (ax,) = fig.axes
    rows, cols = np.meshgrid(np.arange(M), np.arange(N), indexing="ij")
    assert np.array_equal(ax.images[0].get_array(), rows // 16 * 2 + cols // 16 + 2)
    assert sorted(legend_texts(fig)) == sorted(f"block ({x}, {y})" for x in range(2)
                                               for y in range(3))
    assert fig.get_suptitle().replace("\n", " ") == (
        "sgemm_tiled: which block wrote each element of C")
    assert ax.get_title() == "C (40, 24)" and ax.get_xlabel() == "column (0..23)"
    assert ax.get_ylabel() == "row (0..39)"


def test_one_blocks_reads_outlined_and_one_threads_marked(sgemm):
    fig = plot_access_map(sgemm, ("A", "B"), kind="read", color="count", block=(1, 2),
                          thread=(3, 7))
    axA, axB, bar = fig.axes
    assert np.array_equal(axA.images[0].get_array(), np.full((M, K), 2))  # ceil(N/16) blocks
    assert np.array_equal(axB.images[0].get_array(), np.full((K, N), 3))  # ceil(M/16) blocks
    assert bar.get_ylabel() == "distinct blocks that read it"
    # block (1, 2) reads rows 32..39 of A (all K columns) and columns 16..23 of B: rectangles
    (outline,) = [c for c in axA.collections if isinstance(c, LineCollection)]
    assert sorted(tuple(map(tuple, s)) for s in outline.get_segments()) == sorted([
        ((-0.5, 31.5), (-0.5, 39.5)), ((55.5, 31.5), (55.5, 39.5)),
        ((-0.5, 31.5), (55.5, 31.5)), ((-0.5, 39.5), (55.5, 39.5))])
    # thread (3, 7) stages A[39, k0 + 3] and B[k0 + 7, 19] for k0 = 0, 16, 32, 48
    (dots,) = [c for c in axA.collections if isinstance(c, PathCollection)]
    assert sorted(map(tuple, dots.get_offsets().tolist())) == [(k + 3, 39) for k in range(0, K, 16)]
    (dots,) = [c for c in axB.collections if isinstance(c, PathCollection)]
    assert sorted(map(tuple, dots.get_offsets().tolist())) == [(19, k + 7) for k in range(0, K, 16)]
    assert legend_texts(fig) == ["read by block (1, 2)", "... by its thread (3, 7)"]
    assert "outlined: what block (1, 2) read" in fig.get_suptitle().replace("\n", " ")


def test_several_and_none_in_the_legend(sgemm):
    fig = plot_access_map(sgemm, ("A", "C"), kind="read")
    assert legend_texts(fig) == ["several blocks", "no block read it"]
    axA, axC = fig.axes
    assert (axA.images[0].get_array() == 0).all() and (axC.images[0].get_array() == 1).all()


def test_a_truncated_trace_says_so_in_the_title():
    src = r"""extern "C" __global__ void fill(float* y, int n) {
        const int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = 1.0f;
    }"""
    f = emu.RawModule(code=src, name="fill.cu").get_function("fill")
    y = np.zeros(40, np.float32)
    with emu.trace(max_events=25) as tr:
        f((3,), (16,), (y, np.int32(40)))
    fig = plot_access_map(tr.last["y"])
    assert fig.get_suptitle().startswith("TRUNCATED trace, first 25 of 40 accesses")
    assert fig.texts[0].get_color() == "tab:red"  # the suptitle
    (ax,) = fig.axes
    assert list(ax.get_yticks()) == [] and ax.get_xlabel() == "index along the last axis (0..39)"
    assert np.array_equal(ax.images[0].get_array()[0], [2] * 16 + [3] * 9 + [1] * 15)
    assert legend_texts(fig) == ["block 0", "block 1", "no block wrote it"]


def test_bad_arguments(sgemm):
    with pytest.raises(ValueError, match="kind must be"):
        plot_access_map(sgemm, "C", kind="written")
    with pytest.raises(ValueError, match="color must be"):
        plot_access_map(sgemm, "C", color="thread")
    with pytest.raises(ValueError, match="give block="):
        plot_access_map(sgemm, "C", thread=(0, 0))
    with pytest.raises(ValueError, match="outside"):
        plot_access_map(sgemm, "C", block=(2, 0))
    with pytest.raises(KeyError, match="no pointer argument 'D'"):
        plot_access_map(sgemm, "D")
    with pytest.raises(TypeError, match="LaunchTrace or an ArgTrace"):
        plot_access_map(np.zeros((3, 3)))
    with pytest.raises(ValueError, match="args= names arguments"):
        plot_access_map(sgemm["C"], "C")


def test_neighbouring_blocks_get_different_hues():
    """Up to 10 blocks: tab10's colours. More: tab20's 20, whose entries 2k and 2k + 1 are a
    dark and a light shade of one hue; blocks b and b + 1 must never be such a pair, and the
    first 20 blocks get 20 different colours."""
    from matplotlib import colormaps

    from ckptlab.measure.access_plots import block_colors

    tab10, tab20 = list(colormaps["tab10"].colors), list(colormaps["tab20"].colors)
    assert block_colors(7) == tab10[:7]
    colors = block_colors(40)
    assert len(set(colors[:20])) == 20 and colors[20:] == colors[:20]
    hue = {c: i // 2 for i, c in enumerate(tab20)}  # the hue pair each tab20 colour is in
    assert all(hue[colors[b]] != hue[colors[b + 1]] for b in range(39))
