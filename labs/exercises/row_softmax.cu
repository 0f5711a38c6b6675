// Exercise row_softmax (lab 01): a row softmax in one warp, reduced with shuffles
// One warp per row: lane j visits the columns j, j + 32, j + 64, ... You write the
// lane's online (m, l) and the butterfly that merges the 32 lanes' (m, l).
// Fill in the 2 steps marked '>>> YOUR CODE'; everything else is given.
// Check: python -m ckptlab exercise check row_softmax   (--hint 2: a second hint)
// Solution (try first): kernels/softmax_rows.cu, the kernel the labs run.

// softmax_rows.cu: y = softmax(x) along each row, one warp per row, online softmax.
//
//   x, y (R, C) row-major fp32. Block = ROWS_PER_BLOCK warps; warp w of block b owns row
//   r = b * ROWS_PER_BLOCK + w. Lane j visits columns j, j + 32, j + 64, ...
//
//   Pass 1 (online softmax, the trick FlashAttention builds on): each lane keeps a running max
//   m and a running sum l of exp(x - m) over its columns, rescaling l when m grows:
//       m' = max(m, x_c);  l' = l * exp(m - m') + exp(x_c - m')
//   then the 32 (m, l) pairs are merged with butterfly shuffles (no shared memory):
//       m = max(m_a, m_b);  l = l_a exp(m_a - m) + l_b exp(m_b - m)
//   Pass 2: y_c = exp(x_c - m) / l.
//
// Global traffic (counted, exactly): x read twice, y written once:
//   read 2 * R * C * 4 bytes, written R * C * 4 bytes.
// FLOPs: 5 per element in all, both passes together (pass 1: a max, an exp and a multiply-add;
// pass 2: an exp and a scale), as ckptlab.measure.traffic.softmax_rows counts them.
// 5 / 12 ~ 0.42 FLOP/byte: deeply memory-bound (the lab's roofline places it).
#include "common.cuh"

#ifndef ROWS_PER_BLOCK
#define ROWS_PER_BLOCK 4
#endif

extern "C" __global__ void softmax_rows(const float* x, float* y, int R, int C) {
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int r = blockIdx.x * ROWS_PER_BLOCK + warp;
    if (r >= R) return;  // the whole warp leaves together: no barrier or shuffle is pending
    const float* xr = x + (size_t)r * C;
    float m = -INFINITY, l = 0.0f;
    // >>> YOUR CODE, step 1 of 2: this lane's running (m, l) over its columns
    //     Each lane keeps the online softmax state of the columns it visits (c = lane,
    //     lane + WARP, ...): m, the largest value seen so far, and l, the sum of
    //     exp(x_c - m) over them. When a new value raises m, every term already in l
    //     was taken against the old max: bring l to the new one (a factor e^(m_old -
    //     m_new)) before the new term joins. Why: exp of a value minus the running max
    //     is at most 1, so nothing overflows however large x is. Pitfall: while every
    //     value seen is -inf (a masked prefix) m is -inf too, and -inf - (-inf) is
    //     NaN: nothing has been summed yet, so l stays 0 until a finite value arrives.
    //     Updates: m, l.
    // <<< end of step 1
    // >>> YOUR CODE, step 2 of 2: merge the 32 lanes' (m, l) with warp shuffles
    //     After step 1 each lane holds (m, l) of its own columns; the softmax needs
    //     the row's. Merge the 32 states in a butterfly: in each round every lane
    //     exchanges (m, l) with the lane whose index differs in one bit (a shuffle by
    //     xor; FULL_MASK names all 32 lanes) and keeps the merge of the two: the
    //     larger max, and the two sums each brought to it before they are added (step
    //     1's rescale). Five rounds (log2 32), the distance halving from 16 to 1, and
    //     every lane holds the row's (m, l). Pitfall: a lane that saw no column (C <
    //     32) or only -inf has m = -inf, l = 0: its share of the merged sum is 0, not
    //     exp(-inf - (-inf)) = NaN. Updates: m, l, in every lane.
    // <<< end of step 2
    // a row of only -inf has no softmax: write 0 rather than NaN (as the attention kernels do)
    const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
    for (int c = lane; c < C; c += WARP)
        y[(size_t)r * C + c] = l > 0.0f ? __expf(xr[c] - m) * inv_l : 0.0f;
}
