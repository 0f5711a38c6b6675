"""Launch wrappers for the attention kernels in kernels/*.cu: validate, allocate, grid, launch.

    from ckptlab import kernels
    O, saved = kernels.flash_forward(q, k, v, causal=True)
    dq, dk, dv = kernels.flash_backward(dO, q, k, v, saved)

Three methods, one change at a time: naive (unfused) -> stored (fused, P's scores stored)
-> flash (fused, P recomputed). METHODS names them; forward(method, ...) / backward(method,
...) dispatch.

    table.py    the one table of tiles and limits (LANES, NAIVE_TILE from kernels/common.cuh)
    common.py   Saved (what a forward keeps for its backward), argument checks, NaN poison
    naive.py    standard attention: S and P in HBM (3 launches forward, 5 backward)
    flash.py    FlashAttention: O and L kept, P recomputed from L in the backward
    stored.py   the same fused kernels, store-P: S written by the forward, read back
    flash_tc.py the fused pair on tensor cores (float16 / bfloat16 inputs: flash_forward and
                stored_forward hand them over), 16-bit storage, wmma, fp32 statistics
    methods.py  the three methods by name: METHODS, forward(method, ...), backward(...)
    nvrtc.py    NVIDIA's compiler as a check without a GPU: registers, shared memory, spills
                (ptxas_log.py reads its report; ptxas_cache.py keeps the records on disk)

Arrays are fp32 (B, H, N, d) (float16 / bfloat16 for the fused pair), C-contiguous, of the
current target (NumPy on "emu", CuPy on "cuda"). Every input is checked before anything is
launched, `saved` included.

Values are not checked (that would cost a pass over the data): a NaN or Inf in q, k, v or dO
propagates as the math does, within its head: the outputs it reaches through a sum come out
non-finite, as in ckptlab.reference, and other heads are untouched. One caveat: where a NaN
key makes a row's softmax normalizer NaN, the kernels treat the row like one with no visible
key in places, so some outputs of that head stay finite but mean nothing (flash's dV is 0
there). Check inputs with isfinite() where they may be bad.
"""

from ckptlab.kernels.common import Saved, ceil_div, random_inputs, unpoisoned
from ckptlab.kernels.flash import flash_backward, flash_forward
from ckptlab.kernels.methods import METHODS, backward, forward
from ckptlab.kernels.naive import naive_backward, naive_forward
from ckptlab.kernels.stored import stored_backward, stored_forward
from ckptlab.kernels.table import (
    BWD_TILES,
    FWD_TILES,
    HEAD_DIMS,
    LANES,
    MAX_HEAD_DIM,
    MAX_TILE,
    NAIVE_TILE,
    SHARED_LIMIT,
    TILE_HEAD_DIMS,
    flash_bwd_shared_bytes,
    flash_fwd_shared_bytes,
    tile_head_dim,
)

__all__ = ["BWD_TILES", "FWD_TILES", "HEAD_DIMS", "LANES", "MAX_HEAD_DIM", "MAX_TILE",
           "METHODS", "NAIVE_TILE", "SHARED_LIMIT", "Saved", "TILE_HEAD_DIMS", "backward",
           "ceil_div", "flash_backward", "flash_bwd_shared_bytes", "flash_forward",
           "flash_fwd_shared_bytes", "forward", "naive_backward", "naive_forward",
           "random_inputs", "stored_backward", "stored_forward", "tile_head_dim", "unpoisoned"]
