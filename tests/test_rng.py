"""Philox4x32-10 against Random123's published known-answer vectors, and the dropout mask's
statistics and determinism."""

import numpy as np
import pytest

from ckptlab import rng

# Random123 tests/kat_vectors: (counter, key, expected output) for philox4x32-10.
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize("counter,key,expected", KAT)
def test_philox_known_answers(counter, key, expected):
    out = rng.philox4x32(counter, key)
    assert tuple(int(w) for w in out) == expected


def test_vectorised_equals_scalar():
    index = np.array([0, 1, 2**32 + 5, 2**40 + 7], dtype=np.uint64)
    words = rng.random_words(seed=2**33 + 9, offset=3, index=index)
    for i, w in zip(index, words, strict=True):
        c = (int(i) & 0xFFFFFFFF, int(i) >> 32, 3, 0)
        assert int(rng.philox4x32(c, (9, 2))[0]) == int(w)


def test_keep_mask_is_a_pure_function_and_has_the_right_rate():
    a = rng.keep_mask(seed=7, offset=0, shape=(64, 257), p=0.25)
    b = rng.keep_mask(seed=7, offset=0, shape=(64, 257), p=0.25)
    c = rng.keep_mask(seed=7, offset=1, shape=(64, 257), p=0.25)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    n = a.size  # keep rate 0.75; 5 binomial standard deviations
    assert abs(a.mean() - 0.75) < 5 * np.sqrt(0.75 * 0.25 / n)


def test_threshold_bounds():
    assert rng.threshold(0.0) == 0 and rng.keep_mask(1, 0, (10,), 0.0).all()
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        rng.threshold(1.0)
    with pytest.raises(ValueError):
        rng.threshold(-0.1)
