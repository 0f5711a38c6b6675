"""Who touched what, drawn: the access trace of one launch (ckptlab.emu.trace()) as a grid of
each argument's elements, coloured by the block that wrote (or read) each one, or by how many
blocks did; one block's elements outlined, one thread's marked.

    with emu.trace() as tr:
        sgemm((2, 3), (16, 16), (A, B, C, M, N, K))
    plot_access_map(tr.last, ("A", "B", "C"), kind="read", color="count", block=(1, 2))

An argument of more than two dimensions is drawn as rows of its last axis (a (B, H, N, d)
array as B*H*N rows of d), a 1-D one as a single row. Figures are matplotlib Figure objects
(no pyplot), like those of plots.py.
"""

from __future__ import annotations

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.patheffects import withStroke
from matplotlib.ticker import MaxNLocator

from ckptlab.measure.figure import _save, wrap_title

WIDTH_IN = 6.5  # plots.py's notebook width (figure.SIZE_IN)
SEVERAL, NONE = "0.45", "white"  # an element several blocks touched / no block touched
WRONG, RIGHT = "black", "0.92"  # an element whose value is wrong / right (wrong= panels;
# black: no block colour is)
OUTLINE = "black"
MAX_LEGEND_BLOCKS = 12
_VERB = {"read": ("read", "read"), "write": ("write", "wrote"), "atomic": ("update",
                                                                            "updated")}


def block_colors(n: int) -> list:
    """n colours, one per linear block index: tab10's for up to 10 blocks, else tab20's with
    its light and dark shades apart (even entries first), so neighbouring blocks differ."""
    if n <= 10:
        base = list(colormaps["tab10"].colors)
    else:
        tab20 = list(colormaps["tab20"].colors)
        base = tab20[0::2] + tab20[1::2]
    return [base[b % len(base)] for b in range(n)]


def as_grid(a: np.ndarray) -> np.ndarray:
    """The 2-D view drawn: rows of the last axis (1-D: one row; 0-D: one element)."""
    return a.reshape(-1, a.shape[-1]) if a.ndim >= 2 else a.reshape(1, -1)


def outline_segments(mask: np.ndarray) -> list:
    """The border of the True cells of a 2-D mask as straight segments, each as long as it
    runs (a rectangle: 4), in imshow's coordinates (cell (r, c) spans c +- 0.5, r +- 0.5)."""
    m = np.pad(np.asarray(mask, bool), 1)
    vertical = np.argwhere((m[1:-1, :-1] != m[1:-1, 1:]).T)    # (c, r): left of column c
    horizontal = np.argwhere(m[:-1, 1:-1] != m[1:, 1:-1])      # (r, c): above row r
    segs = []
    for edges, flip in ((vertical, True), (horizontal, False)):
        start = 0
        for k in range(1, len(edges) + 1):  # runs of consecutive cells along one line
            if k < len(edges) and edges[k][0] == edges[k - 1][0] and \
                    edges[k][1] == edges[k - 1][1] + 1:
                continue
            line, a, b = (float(edges[start][0]) - 0.5, float(edges[start][1]) - 0.5,
                          float(edges[k - 1][1]) + 0.5)
            segs.append(((line, a), (line, b)) if flip else ((a, line), (b, line)))
            start = k
    return segs


def _labels(ax, arg, rows: int) -> None:
    shape = arg.shape
    n = shape[-1] if shape else 1
    if rows > 1:
        ax.set_ylabel(f"row (index into {' x '.join(map(str, shape[:-1]))})" if len(shape) > 2
                      else f"row (0..{rows - 1})", fontsize=8)
        ax.set_xlabel(f"column (0..{n - 1})", fontsize=8)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=5))
    else:  # one row: its index along the last axis
        ax.set_xlabel(f"index along the last axis (0..{n - 1})", fontsize=8)
        ax.set_yticks([])
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=5))
    ax.tick_params(labelsize=7)
    ax.set_title(f"{arg.name} {tuple(shape)}", fontsize=9)


def _check(trace, args, kind, color, block, thread):
    if hasattr(trace, "args"):  # a LaunchTrace
        launch = trace
        names = [args] if isinstance(args, str) else list(args or launch.args)
        arg_traces = [launch[n] for n in names]
    elif hasattr(trace, "launch"):  # one ArgTrace
        if args is not None:
            raise ValueError("args= names arguments of a LaunchTrace; got a single argument's "
                             "trace")
        launch, arg_traces = trace.launch, [trace]
    else:
        raise TypeError(f"trace must be a LaunchTrace or an ArgTrace (from emu.trace()), got "
                        f"{type(trace).__name__}")
    if not arg_traces:
        raise ValueError("no argument to draw: args is empty")
    if kind not in _VERB:
        raise ValueError(f"kind must be one of {', '.join(_VERB)}, got {kind!r}")
    if color not in ("block", "count"):
        raise ValueError(f"color must be 'block' or 'count', got {color!r}")
    if thread is not None and block is None:
        raise ValueError("thread= names a thread of a block: give block= too")
    for a in arg_traces:
        a.mask(kind, block, thread)  # checks block and thread against the launch
    return launch, arg_traces


def plot_access_map(trace, args=None, *, kind: str = "write", color: str = "block",
                    block=None, thread=None, title: str | None = None, path=None,
                    wrong: dict | None = None) -> Figure:
    """One panel per argument (`args`: a name or names of the launch's pointer arguments;
    default all), each element coloured by the block that did `kind` ("read", "write",
    "atomic"; reads and writes include atomics) to it (color="block": grey where several
    blocks did, white where none did) or by the number of distinct blocks that did
    (color="count"). `block` (blockIdx: an int or a tuple) outlines the elements that block
    did `kind` to and dims the rest; `thread` (threadIdx, with block) marks that thread's.
    `wrong` ({argument name: bool array of its size, True where its value is wrong}) adds,
    beside each argument named, a panel of its wrong elements (black; the rest light grey)."""
    launch, arg_traces = _check(trace, args, kind, color, block, thread)
    wrong = _wrong_masks(arg_traces, wrong)
    past = _VERB[kind][1]
    nblocks = launch.grid[0] * launch.grid[1] * launch.grid[2]
    colors = block_colors(nblocks)
    if color == "block":
        values = [as_grid(a.block_map(kind)) for a in arg_traces]
        drawn = set(np.unique(np.concatenate([v.ravel() for v in values])).tolist())
        cmap = ListedColormap([SEVERAL, NONE, *colors])  # drawn: block_map + 2
        norm = BoundaryNorm(np.arange(-0.5, nblocks + 2), cmap.N)
        values = [v + 2 for v in values]
    else:
        values = [as_grid(a.count(kind, by="block")) for a in arg_traces]
        top = max(1, max(int(v.max(initial=0)) for v in values))
        cmap = ListedColormap([NONE, *colormaps["viridis"](np.linspace(0.15, 0.95, top))])
        norm = BoundaryNorm(np.arange(-0.5, top + 1), cmap.N)
    handles = _legend(launch, color, drawn if color == "block" else set(), colors, past, block,
                      thread)
    if wrong:
        handles.append(Patch(facecolor=WRONG, label="value wrong (the panels headed 'wrong')"))
    shapes = [s for a, v in zip(arg_traces, values, strict=True)
              for s in ([v.shape] * (2 if a.name in wrong else 1))]
    fig = _figure(shapes, color == "count", len(handles))
    panels = iter(fig.subplots(1, len(shapes), squeeze=False,
                               gridspec_kw=dict(width_ratios=[max(c, 1) for _, c in shapes]))[0])
    axes = []
    for a, v in zip(arg_traces, values, strict=True):
        ax = next(panels)
        axes.append(ax)
        if a.name in wrong:
            _wrong_panel(next(panels), a, as_grid(wrong[a.name]))
        image = ax.imshow(v, cmap=cmap, norm=norm, interpolation="nearest", aspect="equal")
        if block is not None:
            ax.add_collection(LineCollection(
                outline_segments(as_grid(a.mask(kind, block))), colors=OUTLINE, linewidths=1.6,
                path_effects=[withStroke(linewidth=3.2, foreground="white")]))
        if thread is not None:
            r, c = np.nonzero(as_grid(a.mask(kind, block, thread)))
            ax.scatter(c, r, s=10, marker="o", facecolors="white", edgecolors="black",
                       linewidths=0.8, zorder=3)
        _labels(ax, a, v.shape[0])
    if color == "count":
        bar = fig.colorbar(image, ax=list(axes), shrink=0.9, ticks=range(0, top + 1))
        bar.set_label(f"distinct blocks that {past} it", fontsize=8)
        bar.ax.tick_params(labelsize=7)
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncol=min(4, len(handles)),
                   fontsize=7, frameon=False)
    if title is None:
        names = ", ".join(a.name for a in arg_traces)
        shown = (f"which block {past} each element" if color == "block"
                 else f"how many blocks {past} each element")
        title = f"{launch.kernel}: {shown} of {names}"
        if block is not None:
            title += f"; outlined: what block {_short(block, launch.grid)} {past}"
    if launch.truncated:
        title = (f"TRUNCATED trace, first {launch.max_events:,} of {launch.total_events:,} "
                 f"accesses: {title}")
    fig.suptitle(wrap_title(title, 80), fontsize=10,
                 color="tab:red" if launch.truncated else "black")
    return _save(fig, path)


def _wrong_masks(arg_traces, wrong) -> dict:
    """{name: bool array in the argument's shape} for the arguments drawn; ValueError for a
    name not drawn or a mask of another size."""
    out = {}
    names = {a.name: a for a in arg_traces}
    for name, mask in (wrong or {}).items():
        if name not in names:
            raise ValueError(f"wrong: {name!r} is not one of the arguments drawn "
                             f"({', '.join(names)})")
        mask = np.asarray(mask, bool)
        if mask.size != int(np.prod(names[name].shape)):
            raise ValueError(f"wrong[{name!r}]: {mask.size} elements, the argument has "
                             f"{int(np.prod(names[name].shape))}")
        out[name] = mask.reshape(names[name].shape)
    return out


def _wrong_panel(ax, arg, mask: np.ndarray) -> None:
    """The elements of `arg` whose value is wrong, black on light grey, as a panel of the same
    grid as the one beside it."""
    ax.imshow(mask.astype(np.int8), cmap=ListedColormap([RIGHT, WRONG]),
              norm=BoundaryNorm([-0.5, 0.5, 1.5], 2), interpolation="nearest", aspect="equal")
    _labels(ax, arg, mask.shape[0])
    ax.set_title(f"{arg.name}: wrong ({int(mask.sum()):,} of {mask.size:,})", fontsize=9)


def _figure(shapes, colorbar: bool, handles: int) -> Figure:
    """A figure 6.5 inches wide (a notebook's width, room for the title and the legend) whose
    panels (shapes: each panel's (rows, columns)) show elements as squares of one size: as
    large as fits across, and 4.2 inches down."""
    rows, cols = max(r for r, _ in shapes), sum(c for _, c in shapes)
    frame = 1.0 + 0.55 * (len(shapes) - 1) + (0.9 if colorbar else 0.0)  # labels, gaps, bar
    scale = min((WIDTH_IN - frame) / max(cols, 1), 4.2 / max(rows, 1))
    height = max(2.4, scale * rows + 1.7 + 0.22 * -(-handles // 4))
    fig = Figure(figsize=(WIDTH_IN, height), layout="constrained")
    FigureCanvasAgg(fig)  # a canvas to draw and save with, no display
    return fig


def _legend(launch, color, drawn, colors, past, block, thread) -> list:
    handles = []
    if color == "block":
        blocks = sorted(b for b in drawn if b >= 0)
        handles += [Patch(facecolor=colors[b],
                          label=f"block {_short(launch.block_index(b), launch.grid)}")
                    for b in blocks[:MAX_LEGEND_BLOCKS]]
        if len(blocks) > MAX_LEGEND_BLOCKS:
            handles.append(Patch(facecolor="none", edgecolor="none",
                                 label=f"... {len(blocks) - MAX_LEGEND_BLOCKS} more blocks"))
        if -2 in drawn:
            handles.append(Patch(facecolor=SEVERAL, label="several blocks"))
        if -1 in drawn:
            handles.append(Patch(facecolor=NONE, edgecolor="0.6", label=f"no block {past} it"))
    if block is not None:
        handles.append(Line2D([], [], color=OUTLINE, lw=1.6,
                              label=f"{past} by block {_short(block, launch.grid)}"))
    if thread is not None:
        handles.append(Line2D([], [], marker="o", ls="none", markerfacecolor="white",
                              markeredgecolor="black", markersize=4,
                              label=f"... by its thread {_short(thread, launch.block_dim)}"))
    return handles


def _short(index, dims) -> str:
    """blockIdx / threadIdx (an int or a tuple) with as many of x, y, z as the launch uses:
    "(1, 2)" in a 2-D grid, "3" in a 1-D one."""
    idx = (index,) if isinstance(index, (int, np.integer)) else tuple(index)
    idx = tuple(int(v) for v in idx) + (0,) * (3 - len(idx))
    used = max([1] + [i + 1 for i in range(3) if dims[i] > 1])
    return str(idx[0]) if used == 1 else str(idx[:used])
