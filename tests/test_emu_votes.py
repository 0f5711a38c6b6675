"""Block-wide and warp votes against NumPy: __syncthreads_and/_or/_count over two warps, and
__ballot_sync, __any_sync, __all_sync with full and partial masks, on predicates that mix true
and false (and non-zero values other than 1), so that `and` answering as `or`, a vote reading
lanes outside its mask, or a predicate not taken as != 0 gives a wrong value somewhere."""

import numpy as np
import pytest

from ckptlab import emu

SRC = r"""
extern "C" __global__ void votes(const int* pred, int* out, unsigned mask) {
    const int t = threadIdx.x, lane = t & 31;
    const int p = pred[t];
    out[0 * 64 + t] = __syncthreads_and(p);
    out[1 * 64 + t] = __syncthreads_or(p);
    out[2 * 64 + t] = __syncthreads_count(p);
    if ((mask >> lane) & 1u) {  // only the lanes of the mask vote
        out[3 * 64 + t] = (int)__ballot_sync(mask, p);
        out[4 * 64 + t] = __any_sync(mask, p);
        out[5 * 64 + t] = __all_sync(mask, p);
    }
}
"""
THREADS, POISON = 64, -12345


@pytest.fixture(scope="module")
def kernel():
    return emu.RawModule(code=SRC, name="votes.cu").get_function("votes")


def predicates(kind: str, rng) -> np.ndarray:
    """64 predicates; true ones are random non-zero ints (not only 1)."""
    true = rng.choice(np.array([1, 2, 7, -3, 1 << 30, -(1 << 31)], np.int32), THREADS)
    truth = {"all": np.ones(THREADS, bool), "none": np.zeros(THREADS, bool),
             "one false": np.arange(THREADS) != rng.integers(THREADS),
             "one true": np.arange(THREADS) == rng.integers(THREADS),
             "mixed": rng.random(THREADS) < 0.5,
             "one warp true": np.arange(THREADS) < 32}[kind]
    return np.where(truth, true, 0).astype(np.int32)


def expected(pred: np.ndarray, mask: int) -> np.ndarray:
    p = pred != 0
    out = np.full((6, THREADS), POISON, np.int64)
    out[0], out[1], out[2] = p.all(), p.any(), p.sum()
    lanes = np.array([(mask >> i) & 1 for i in range(32)], bool)
    for w in range(THREADS // 32):
        pw = p[32 * w:32 * w + 32]
        ballot = sum(1 << i for i in range(32) if lanes[i] and pw[i])
        cols = 32 * w + np.flatnonzero(lanes)
        out[3, cols] = np.int64(np.uint32(ballot).view(np.int32))
        out[4, cols] = pw[lanes].any()
        out[5, cols] = pw[lanes].all()
    return out


MASKS = [0xFFFFFFFF, 0x0000FFFF, 0x80000001, 0xAAAAAAAA, 0x00000004]


@pytest.mark.parametrize("kind", ["all", "none", "one false", "one true", "mixed",
                                  "one warp true"])
@pytest.mark.parametrize("mask", MASKS, ids=[hex(m) for m in MASKS])
def test_block_and_warp_votes_match_numpy(kernel, kind, mask):
    rng = np.random.default_rng()
    pred = predicates(kind, rng)
    out = np.full(6 * THREADS, POISON, np.int32)
    kernel((1,), (THREADS,), (pred, out, np.uint32(mask)))
    got, want = out.reshape(6, THREADS).astype(np.int64), expected(pred, mask)
    # CUDA promises a non-zero value for true (and, or, any, all): compare truth, and the
    # lanes outside the mask untouched (still the poison)
    for row in (0, 1, 4, 5):
        voted = want[row] != POISON
        assert np.array_equal(got[row][voted] != 0, want[row][voted] != 0), (row, pred)
        assert (got[row][~voted] == POISON).all(), row
    assert np.array_equal(got[2], want[2]) and np.array_equal(got[3], want[3]), pred


def test_a_vote_with_true_lanes_only_outside_its_mask_is_false(kernel):
    """Every lane's predicate is true except those of the mask: any is false, all is false,
    the ballot empty; with the opposite predicates, all is true though most lanes are false."""
    mask = 0x0000FF00
    inside = np.array([(mask >> (t & 31)) & 1 for t in range(THREADS)], bool)
    for pred, any_, all_ in ((np.where(inside, 0, 5), 0, 0), (np.where(inside, 5, 0), 1, 1)):
        out = np.full(6 * THREADS, POISON, np.int32)
        kernel((1,), (THREADS,), (pred.astype(np.int32), out, np.uint32(mask)))
        got = out.reshape(6, THREADS)[:, inside]
        assert ((got[3] != 0) == bool(any_)).all() and (got[3] == (mask if any_ else 0)).all()
        assert ((got[4] != 0) == bool(any_)).all() and ((got[5] != 0) == bool(all_)).all()
        assert (got[0] == 0).all() and (got[1] != 0).all()  # the block has both kinds
