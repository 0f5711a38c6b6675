// philox.cuh: Philox4x32-10 (Salmon et al., SC'11) and the dropout factor built on it.
//
// Bit for bit the same function as ckptlab/rng.py, so a mask drawn in a kernel equals the one
// the float64 reference draws in NumPy:
//   key     = (seed lo, seed hi)
//   counter = (index lo, index hi, offset lo, offset hi)
//   element `index` is kept iff (word0 >> 8) >= threshold, threshold = round(p * 2^24)
// For attention the index of P_ij is ((b*H + h)*Nq + i)*Nk + j: its position in a contiguous
// (B, H, Nq, Nk) array. Nothing is stored: the backward calls the same function again.
#pragma once

#define PHILOX_M0 0xD2511F53u  // round multipliers
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u  // key schedule (Weyl) increments
#define PHILOX_W1 0xBB67AE85u
#define PHILOX_ROUNDS 10

// First output word of Philox4x32-10 for (seed, offset, index).
__device__ __forceinline__ unsigned philox_word0(unsigned long long seed,
                                                 unsigned long long offset,
                                                 unsigned long long index) {
    unsigned c0 = (unsigned)index, c1 = (unsigned)(index >> 32);
    unsigned c2 = (unsigned)offset, c3 = (unsigned)(offset >> 32);
    unsigned k0 = (unsigned)seed, k1 = (unsigned)(seed >> 32);
    for (int r = 0; r < PHILOX_ROUNDS; ++r) {
        if (r > 0) {  // bump the key between rounds
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        const unsigned hi0 = __umulhi(PHILOX_M0, c0), lo0 = PHILOX_M0 * c0;
        const unsigned hi1 = __umulhi(PHILOX_M1, c2), lo1 = PHILOX_M1 * c2;
        const unsigned n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
    }
    return c0;
}

// Dropout on P: P_dropped = P * Z / (1 - p), Z ~ Bernoulli(1 - p) drawn from (seed, offset).
// threshold == 0 means no dropout (p = 0): the factor is exactly 1 and no word is drawn.
struct Dropout {
    unsigned long long seed, offset;
    unsigned threshold;  // round(p * 2^24)
    float inv_keep;      // 1 / (1 - p)
};

// Z_index / (1 - p): 0 for a dropped element, inv_keep for a kept one, 1 without dropout.
__device__ __forceinline__ float dropout_factor(const Dropout& drop, unsigned long long index) {
    if (drop.threshold == 0) return 1.0f;
    const unsigned word = philox_word0(drop.seed, drop.offset, index);
    return (word >> 8) >= drop.threshold ? drop.inv_keep : 0.0f;
}
