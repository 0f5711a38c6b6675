// common.cuh: the small helpers every attention kernel shares.
//
//   ceil_div                 number of tiles that cover n elements
//   group_max / group_sum    max / sum over the WIDTH lanes of a lane group (xor butterfly)
//   View, naive_matmul_tile  one NAIVE_TILE x NAIVE_TILE tile of C = op(A) op(B) through
//                            shared memory: the plain tiled matmul of the naive kernels
//   visible                  does query i see key j (in range, and causal bottom-right)
//   load_rows, load_vec      a tile of rows of a (N, d) matrix, or of a per-row vector (L, D),
//                            into shared memory, zero-padded past N and past d
//   load_scores              a (Br x Bc) tile of the stored scores S into shared memory
//
// Head dims: the flash kernels are instantiated for a tile head dim Dt (a template argument,
// one of a few: ckptlab/kernels/table.py) and take the real head dim d <= Dt at run time, as
// FlashAttention rounds its head dim up. Shared-memory tiles are Dt wide; columns d..Dt-1 are
// zero there, never loaded from and never stored to global memory, so global traffic depends
// on d only and the padded columns add only (zero) multiply-adds.
//
// Thread layout used by the flash kernels: a "row group" of LANES consecutive threads
// (threadIdx.x = lane) shares one row of a tile. LANES divides 32, so a row group always
// lives inside one warp: its reductions are shuffles and its private shared-memory rows
// only need __syncwarp, not __syncthreads.
#pragma once

#include "philox.cuh"

#ifndef INFINITY  // NVRTC has no <math.h>; nvcc and the emulator define it already
#define INFINITY __int_as_float(0x7f800000)
#endif

#define LANES 8            // threads sharing one row of a tile (flash kernels)
#define WARP 32            // threads in a warp
#define FULL_MASK 0xffffffffu
#define NAIVE_TILE 16      // naive matmuls: NAIVE_TILE x NAIVE_TILE outputs per block, one each
#define MAX_HEAD_DIM 256   // the largest head dim of the flash kernels (FlashAttention's too)

__device__ __forceinline__ int ceil_div(int n, int tile) { return (n + tile - 1) / tile; }

// max over the WIDTH lanes of this thread's lane group; every lane of the warp must call it.
template <int WIDTH>
__device__ __forceinline__ float group_max(float x) {
    for (int o = WIDTH / 2; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(FULL_MASK, x, o, WIDTH));
    return x;
}

// sum over the WIDTH lanes of this thread's lane group; every lane of the warp must call it.
template <int WIDTH>
__device__ __forceinline__ float group_sum(float x) {
    for (int o = WIDTH / 2; o > 0; o /= 2) x += __shfl_xor_sync(FULL_MASK, x, o, WIDTH);
    return x;
}

// A strided (rows x cols) view of one matrix: element (r, c) is p[r * rs + c * cs].
// The transpose of a row-major matrix is the same memory with rs and cs swapped.
struct View {
    const float* p;
    long long rs, cs;
};

// acc = sum_k A(row, k) * B(k, col) for this thread's output (row, col), where
// row = blockIdx.y * NAIVE_TILE + threadIdx.y and col = blockIdx.x * NAIVE_TILE + threadIdx.x,
// A is (M x K) and B is (K x N). Tiles of A and B, NAIVE_TILE deep along k, go through shared
// memory; elements outside the matrices are never loaded (so never counted) and read as 0.
// Each block loads every in-range element of its A rows and B columns exactly once, so over a
// launch A is read ceil(N / NAIVE_TILE) times and B ceil(M / NAIVE_TILE) times.
// When drop_a is enabled A is the probability matrix P (or P^T): each element is multiplied by
// its dropout factor, its element index being a_index0 + r * A.rs + c * A.cs, i.e. its
// position ((b*H + h)*Nq + i)*Nk + j in the whole P array.
// Every thread of the block must call this (it contains __syncthreads).
__device__ __forceinline__ float naive_matmul_tile(View A, View B, int M, int N, int K,
                                                   const Dropout& drop_a,
                                                   unsigned long long a_index0) {
    __shared__ float As[NAIVE_TILE][NAIVE_TILE + 1];  // +1: column reads hit distinct banks
    __shared__ float Bs[NAIVE_TILE][NAIVE_TILE + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * NAIVE_TILE + ty, col = blockIdx.x * NAIVE_TILE + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += NAIVE_TILE) {
        const int ka = k0 + tx, kb = k0 + ty;
        float a = 0.0f, b = 0.0f;
        if (row < M && ka < K) {  // this thread loads A(row, k0 + tx) and B(k0 + ty, col)
            const long long e = row * A.rs + ka * A.cs;
            a = A.p[e] * dropout_factor(drop_a, a_index0 + e);  // 1 without dropout
        }
        if (kb < K && col < N) b = B.p[kb * B.rs + col * B.cs];
        As[ty][tx] = a;
        Bs[ty][tx] = b;
        __syncthreads();  // the A and B tiles are complete before anyone multiplies them
        for (int kk = 0; kk < NAIVE_TILE; ++kk) acc += As[ty][kk] * Bs[kk][tx];
        __syncthreads();  // everyone is done with these tiles before the next k0 overwrites them
    }
    return acc;
}

// Does query i see key j: both in range and, when causal, j <= i + Nk - Nq (the mask aligned
// to the bottom-right corner, as FlashAttention 2.1+ does when Nq != Nk).
__device__ __forceinline__ bool visible(int i, int j, int Nq, int Nk, int causal) {
    return i < Nq && j < Nk && (!causal || j <= i + Nk - Nq);
}

// Rows [r0, r0 + R) of a row-major (N, d) matrix into dst[R][STRIDE] (Dt columns used):
// dst[rr][c] = src[r0 + rr][c] for rows < N and c < d, 0 elsewhere. Consecutive threads read
// consecutive columns of a row (coalesced); padding is never loaded.
template <int Dt, int R, int STRIDE>
__device__ __forceinline__ void load_rows(float (*dst)[STRIDE], const float* src, int r0, int N,
                                          int d, int tid, int nthreads) {
    static_assert(Dt <= STRIDE, "a row of the tile holds Dt columns");
    for (int e = tid; e < R * Dt; e += nthreads) {
        const int rr = e / Dt, c = e % Dt;
        float x = 0.0f;
        if (r0 + rr < N && c < d) x = src[(long long)(r0 + rr) * d + c];
        dst[rr][c] = x;
    }
}

// R entries of a per-row vector (L or D) starting at r0, `fill` past N; one thread each.
template <int R>
__device__ __forceinline__ void load_vec(float* dst, const float* src, int r0, int N, float fill,
                                         int tid) {
    if (tid < R) dst[tid] = r0 + tid < N ? src[r0 + tid] : fill;
}

// The (Br x Bc) tile at (q0, k0) of the stored scores S of one (b, h), a row-major (Nq, Nk)
// array, into dst[Br][STRIDE]: consecutive threads read consecutive keys of a row (coalesced),
// never a column per thread. Only visible entries are read (the forward wrote only those);
// the others are -inf, so that P = exp(S - L) = 0 there.
template <int Br, int Bc, int STRIDE>
__device__ __forceinline__ void load_scores(float (*dst)[STRIDE], const float* S, int q0, int k0,
                                            int Nq, int Nk, int causal, int tid, int nthreads) {
    static_assert(Bc <= STRIDE, "a row of the tile holds Bc scores");
    for (int e = tid; e < Br * Bc; e += nthreads) {
        const int ii = e / Bc, jj = e % Bc, i = q0 + ii, j = k0 + jj;
        dst[ii][jj] = visible(i, j, Nq, Nk, causal) ? S[(long long)i * Nk + j] : -INFINITY;
    }
}
