"""Unique bytes (the distinct bytes a launch touches: what an infinite cache would move, a lower
bound on DRAM traffic) against counted bytes (every request, no cache: an upper bound), per
kernel argument, in traffic's models. (The emulator's own unique counts against this model
come with the emulator's unique-byte counting.)"""

from ckptlab.measure import traffic


def test_model_unique_at_most_counted_at_scale():
    """The two models at sizes the emulator would take minutes for (N = 1024, 4096; d = 64, 128,
    256), causal and not: unique <= counted per argument, and equal for the arguments touched
    once (O, L and dK, dV written once; S read once by each stored backward kernel)."""
    for N in (1024, 4096):
        for d in (64, 128, 256):
            for causal in (False, True):
                for variant in traffic.VARIANTS:
                    for m in traffic.launches(variant, 1, 1, N, N, d, causal):
                        for n in m.read:
                            assert m.unique_read[n] <= m.read[n], (m.kernel, n)
                            assert m.unique_write[n] <= m.write[n], (m.kernel, n)
                            assert m.unique_atomic[n] <= 4 * m.atomics[n], (m.kernel, n)
                        if m.kernel.startswith(("attn_flash_bwd_dkdv", "attn_flash_bwd_dq")):
                            assert m.unique_read["S"] == m.read["S"]


def test_unique_n_by_n_bytes_of_the_three_methods():
    """What an infinite cache would still move of the N x N arrays, N = 1024, d = 64, forward +
    backward, one launch at a time: naive writes S, P, dP, dS once each and reads them in 1, 3,
    1 and 2 later launches (11 N^2 floats); stored writes S once and reads it once (atomic dQ)
    or twice (deterministic: dkdv and dq each); flash moves nothing N x N."""
    N, d, nn = 1024, 64, 1024 * 1024 * 4

    def n_by_n(variant):
        return sum(m.unique_read.get(n, 0) + m.unique_write.get(n, 0)
                   for m in traffic.launches(variant, 1, 1, N, N, d)
                   for n in ("S", "P", "dP", "dS"))

    assert n_by_n("naive") == 11 * nn
    assert n_by_n("stored") == 2 * nn and n_by_n("stored-det") == 3 * nn
    assert n_by_n("flash") == n_by_n("flash-det") == 0
