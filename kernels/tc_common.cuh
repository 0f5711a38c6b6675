// tc_common.cuh: what the tensor-core attention kernels (attn_flash_*_tc.cu) share.
//
//   TC                      the wmma tile: 16 x 16 x 16 (m = n = k), for __half and __nv_bfloat16
//   to_float, from_float    the 16-bit storage type T <-> fp32 (round to nearest even)
//   tc_visible              does query i see key j (in range; causal aligned bottom-right)
//   load_tile               rows of a (N, d) matrix of T into a shared tile, zero past N and d
//   load_vec_tc             a tile's entries of a per-row fp32 vector (L, D)
//   load_scores_tc          a (Br x Bc) tile of the stored scores S (fp32) into shared memory
//   mma_k                   acc += A B over k, 16 at a time, for a warp (wmma)
//   FwdSmem, BwdSmem, DqSmem  where each tile lives in the block's dynamic shared memory
//
// Precision: Q, K, V, dO, O and the gradients are T in global memory (L, D and the stored
// scores S are fp32); every matmul runs on tensor cores with T inputs and fp32 accumulators;
// the softmax statistics (m, l, L, D) and every elementwise step (exp, the online rescaling,
// dS = P (dP - D)) are fp32. P and dS are rounded to T only where they become a matmul's
// input, as FlashAttention does.
//
// Warps own 16-row strips of a tile; a 16 x 16 block of a matmul is one wmma accumulator. The
// fragment layout is unspecified, so accumulators go through shared memory (fp32) whenever a
// lane needs to know which row an element is in (the online softmax, rescaling O, atomics).
//
// Shared memory is one dynamic buffer carved into tiles (so that large head dims can opt in
// above 48 KiB, as CUDA requires for more than 48 KiB). Tile rows are padded so that each is a
// multiple of 16 bytes (wmma's ldm rule) and every 16-row block starts 32-byte aligned; the
// byte sizes are mirrored in ckptlab/kernels/table.py (tc_*_shared_bytes; a test compares them).
#pragma once

#include <mma.h>

#include "common.cuh"

#define TC 16  // wmma tile: m = n = k = 16

using namespace nvcuda;

__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16(x);
}

// Does query i see key j: both in range and, when causal, j <= i + Nk - Nq (bottom-right).
__device__ __forceinline__ bool tc_visible(int i, int j, int Nq, int Nk, int causal) {
    return i < Nq && j < Nk && (!causal || j <= i + Nk - Nq);
}

// Rows [r0, r0 + R) of a row-major (N, d) matrix into dst (R rows of ld elements, Dt used):
// dst[rr][c] = src[r0 + rr][c] for rows < N and c < d, 0 elsewhere (padding is never loaded).
template <class T, int Dt>
__device__ __forceinline__ void load_tile(T* dst, int ld, const T* src, int r0, int R, int N,
                                          int d, int tid, int nthreads) {
    for (int e = tid; e < R * Dt; e += nthreads) {
        const int rr = e / Dt, c = e % Dt;
        T x = from_float<T>(0.0f);
        if (r0 + rr < N && c < d) x = src[(long long)(r0 + rr) * d + c];
        dst[rr * ld + c] = x;
    }
}

// R entries of a per-row fp32 vector (L or D) starting at r0, 0 past N.
__device__ __forceinline__ void load_vec_tc(float* dst, const float* src, int r0, int R, int N,
                                            int tid, int nthreads) {
    for (int e = tid; e < R; e += nthreads) dst[e] = r0 + e < N ? src[r0 + e] : 0.0f;
}

// The (Br x Bc) tile at (q0, k0) of the stored scores S (fp32) of one (b, h), row-major
// (Nq, Nk), into dst (ld per row). Only visible entries are read (the forward wrote only
// those); the others are -inf, so that P = exp(S - L) = 0 there.
__device__ __forceinline__ void load_scores_tc(float* dst, int ld, const float* S, int q0, int k0,
                                               int Br, int Bc, int Nq, int Nk, int causal,
                                               int tid, int nthreads) {
    for (int e = tid; e < Br * Bc; e += nthreads) {
        const int ii = e / Bc, jj = e % Bc, i = q0 + ii, j = k0 + jj;
        dst[ii * ld + jj] = tc_visible(i, j, Nq, Nk, causal) ? S[(long long)i * Nk + j] : -INFINITY;
    }
}

// Row or column major: where the next 16-deep slice of a wmma operand starts.
template <class L> struct Major;
template <> struct Major<wmma::row_major> { static constexpr bool row = true; };
template <> struct Major<wmma::col_major> { static constexpr bool row = false; };

typedef wmma::fragment<wmma::accumulator, TC, TC, TC, float> Acc;

// acc += A B for one warp: A is 16 x (16 kblocks) at a (layout LA, leading dimension lda), B is
// (16 kblocks) x 16 at b (layout LB, ldb). Every lane of the warp must call it.
template <class T, class LA, class LB>
__device__ __forceinline__ void mma_k(Acc& acc, const T* a, int lda, const T* b, int ldb,
                                      int kblocks) {
    wmma::fragment<wmma::matrix_a, TC, TC, TC, T, LA> fa;
    wmma::fragment<wmma::matrix_b, TC, TC, TC, T, LB> fb;
    for (int kb = 0; kb < kblocks; ++kb) {
        wmma::load_matrix_sync(fa, a + kb * (Major<LA>::row ? TC : TC * lda), lda);
        wmma::load_matrix_sync(fb, b + kb * (Major<LB>::row ? TC * ldb : TC), ldb);
        wmma::mma_sync(acc, fa, fb, acc);
    }
}

// ---- shared-memory layouts (bytes; each region starts 128-byte aligned) ----------------------
__host__ __device__ constexpr int tc_round(int bytes) { return (bytes + 127) / 128 * 128; }

// Row pitches: LDT for (rows x Dt) tiles of T, LDS for (rows x Bc) fp32 scores, LDP for
// (rows x Bc) tiles of T (P, dS), LDO for (rows x Dt) fp32 accumulators (O, dK, dV, dQ).
template <int Dt, int Bc> struct Pitch {
    static constexpr int LDT = Dt + 8, LDS = Bc + 4, LDP = Bc + 8, LDO = Dt + 4;
};

// forward: Q_i, K_j, V_j (T); S (fp32); P_dropped (T); the O accumulator (fp32)
template <class T, int Dt, int Br, int Bc> struct FwdSmem : Pitch<Dt, Bc> {
    using P = Pitch<Dt, Bc>;
    static constexpr int e = sizeof(T);
    static constexpr int Q = 0, K = Q + tc_round(Br * P::LDT * e), V = K + tc_round(Bc * P::LDT * e);
    static constexpr int S = V + tc_round(Bc * P::LDT * e), Pd = S + tc_round(Br * P::LDS * 4);
    static constexpr int O = Pd + tc_round(Br * P::LDP * e);
    static constexpr int bytes = O + tc_round(Br * P::LDO * 4);
};

// dK/dV: K_j, V_j, Q_i, dO_i (T); S and dP (fp32), which the atomic dQ tile (fp32) reuses;
// P_dropped and dS (T); the dK, dV accumulators (fp32); L_i, D_i
template <class T, int Dt, int Br, int Bc> struct BwdSmem : Pitch<Dt, Bc> {
    using P = Pitch<Dt, Bc>;
    static constexpr int e = sizeof(T);
    static constexpr int scores = 2 * Br * P::LDS * 4, dq = Br * P::LDO * 4;
    static constexpr int K = 0, V = K + tc_round(Bc * P::LDT * e), Q = V + tc_round(Bc * P::LDT * e);
    static constexpr int dO = Q + tc_round(Br * P::LDT * e), S = dO + tc_round(Br * P::LDT * e);
    static constexpr int dP = S + Br * P::LDS * 4;
    static constexpr int Pd = S + tc_round(scores > dq ? scores : dq);
    static constexpr int dS = Pd + tc_round(Br * P::LDP * e), dK = dS + tc_round(Br * P::LDP * e);
    static constexpr int dV = dK + tc_round(Bc * P::LDO * 4), L = dV + tc_round(Bc * P::LDO * 4);
    static constexpr int D = L + tc_round(Br * 4);
    static constexpr int bytes = D + tc_round(Br * 4);
};

// deterministic dQ: Q_i, dO_i, K_j, V_j (T); S and dP (fp32); dS (T); the dQ accumulator
// (fp32); L_i, D_i
template <class T, int Dt, int Br, int Bc> struct DqSmem : Pitch<Dt, Bc> {
    using P = Pitch<Dt, Bc>;
    static constexpr int e = sizeof(T);
    static constexpr int Q = 0, dO = Q + tc_round(Br * P::LDT * e);
    static constexpr int K = dO + tc_round(Br * P::LDT * e), V = K + tc_round(Bc * P::LDT * e);
    static constexpr int S = V + tc_round(Bc * P::LDT * e), dP = S + tc_round(Br * P::LDS * 4);
    static constexpr int dS = dP + tc_round(Br * P::LDS * 4), dQ = dS + tc_round(Br * P::LDP * e);
    static constexpr int L = dQ + tc_round(Br * P::LDO * 4), D = L + tc_round(Br * 4);
    static constexpr int bytes = D + tc_round(Br * 4);
};
