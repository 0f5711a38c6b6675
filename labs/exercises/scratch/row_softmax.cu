// Exercise scratch/row_softmax (lab 01): a row softmax in one warp, from the mathematics.
// The kernel's signature and its launch are given; its body is yours.
// Check: python -m ckptlab exercise check scratch/row_softmax   (--hint 2: a second hint)
// The same check as the guided labs/exercises/row_softmax.cu (same cases, same diagnosis).
// Solution (try first): kernels/softmax_rows.cu, the kernel the labs run.
//
// ---- What to compute ------------------------------------------------------------------------
//   x, y (R, C), row-major fp32:   y_rc = exp(x_rc) / sum_c' exp(x_rc')
// for every row r, in one pass over x for the row's statistics and one to write y, with
// nothing but registers and warp shuffles (no shared memory). Stated without overflow: with
// m_r = max_c x_rc and l_r = sum_c exp(x_rc - m_r), y_rc = exp(x_rc - m_r) / l_r; every
// exponent is then <= 0, so x ~ 100 or more cannot overflow exp.
// Online: (m, l) can be formed one value at a time, starting from m = -inf, l = 0:
//   m' = max(m, x_c),  l' = l * exp(m - m') + exp(x_c - m')
// and two partial states of the same row, (m_a, l_a) and (m_b, l_b), merge into
//   m = max(m_a, m_b),  l = l_a * exp(m_a - m) + l_b * exp(m_b - m).
// Masked values are -inf: they add nothing. A state that has seen only -inf (m = -inf, l = 0)
// must stay l = 0 and weigh 0 in a merge (exp(-inf - (-inf)) is NaN). A row of only -inf
// has no softmax: its y is 0.
//
// ---- Launch (ckptlab/exercises/write/rows.py, ckptlab/kernels/table.py) ---------------------
// grid (ceil(R / ROWS_PER_BLOCK)), block (32 * ROWS_PER_BLOCK): warp w = threadIdx.x / 32 of
// block b owns row r = b * ROWS_PER_BLOCK + w; its lane = threadIdx.x % 32 owns the columns
// lane, lane + 32, lane + 64, ... C need not be a multiple of 32, and may be below it (lanes
// with no column). A warp whose row is past R must not write, and every lane of a warp must
// take part in each __shfl_*_sync it calls.
// Bytes: the lab's model reads x twice and writes y once (2 R C + R C floats); the check
// prints yours beside it once you are right.
//
// ---- Given ----------------------------------------------------------------------------------
// common.cuh: WARP, FULL_MASK, ceil_div, group_max / group_sum (a butterfly over lanes); CUDA's
// __shfl_xor_sync(mask, value, lane_mask), __expf, fmaxf, INFINITY.
#include "common.cuh"

#ifndef ROWS_PER_BLOCK
#define ROWS_PER_BLOCK 4
#endif

extern "C" __global__ void softmax_rows(const float* x, float* y, int R, int C) {
    // >>> YOUR CODE, step 1 of 1: the body of softmax_rows
    //     The warp's row: each lane's (m, l) over its columns, the 32 states merged so that
    //     every lane holds the row's, then y for the lane's columns.
    // <<< end of step 1
}
