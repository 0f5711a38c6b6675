// Exercise scratch/naive_ds (lab 03): the softmax's backward of the store-P method, from the
// mathematics. The five kernels of the naive backward are given but one, attn_naive_bwd_ds:
// its signature and launch are given, its body is yours.
// Check: python -m ckptlab exercise check scratch/naive_ds   (--hint 2: a second hint)
// The same check as the guided labs/exercises/naive_ds.cu (same cases, same diagnosis).
// Solution (try first): kernels/attn_naive_bwd.cu, the kernels the labs run.
//
// ---- What to compute (per head (b, h); fp32, contiguous, row-major) ------------------------
// The forward stored P = softmax(S) (B, H, Nq, Nk), S = scale * Q K^T; attn_naive_bwd_dp wrote
// dP = dLoss/dP (B, H, Nq, Nk). P = softmax(S) row by row: the derivative of P_ij' by S_ij
// is P_ij' ([j = j'] - P_ij), so for each row i
//   dS_ij = sum_j' dP_ij' P_ij' ([j = j'] - P_ij) = P_ij (dP_ij - D_i),  D_i = sum_j dP_ij P_ij
// (D_i also equals rowsum(dO_i * O_i): the flash backward uses that form). Write dS
// (B, H, Nq, Nk). A masked entry has P_ij = 0, so dS_ij = 0 there; a row that sees no key
// has P = 0 everywhere and gets dS = 0.
//
// ---- Launch (ckptlab/kernels/naive.py) --------------------------------------------------------
// attn_naive_bwd_ds: grid (ceil(Nq / rows), B*H), block (32, rows) (rows = 4, a launch
// choice: read blockDim.y). Warp threadIdx.y of block blockIdx.x owns row
// i = blockIdx.x * blockDim.y + threadIdx.y of head bh = blockIdx.y; its lane = threadIdx.x
// owns the keys j = lane, lane + 32, ... Nk need not be a multiple of 32, and may be below it.
// A warp whose row is past Nq must not write, and every lane of a warp must take part in each
// shuffle (group_sum) it calls. Bytes: the lab's model reads P and dP twice (one pass for D,
// one for dS) and writes dS once; the check prints yours beside it once you are right.
//
// ---- Given ----------------------------------------------------------------------------------
// common.cuh: WARP, group_sum<WIDTH> (a sum over WIDTH lanes by xor butterfly), ceil_div;
// the other four kernels below (dV, dP, dQ, dK: tiled matmuls, lab 02's).
#include "common.cuh"

// dV = P_dropped^T dO.  grid (ceil(d/T), ceil(Nk/T), B*H), block (T, T): one dV_jc per thread.
extern "C" __global__ void attn_naive_bwd_dv(const float* P, const float* dO, float* dV, int Nq,
                                             int Nk, int d, unsigned long long seed,
                                             unsigned long long offset, unsigned threshold,
                                             float inv_keep) {
    const long long bh = blockIdx.z;
    const View At = {P + bh * Nq * Nk, 1, Nk};  // P^T: (Nk x Nq), element (j, i) = P[i][j]
    const View B = {dO + bh * Nq * d, d, 1};    // dO: (Nq x d)
    const Dropout drop = {seed, offset, threshold, inv_keep};
    const float acc = naive_matmul_tile(At, B, Nk, d, Nq, drop, bh * Nq * Nk);
    const int j = blockIdx.y * NAIVE_TILE + threadIdx.y, c = blockIdx.x * NAIVE_TILE + threadIdx.x;
    if (j < Nk && c < d) dV[(bh * Nk + j) * d + c] = acc;
}

// dP = (dO V^T) * Z / (1 - p): the gradient reaching the undropped P.
// grid (ceil(Nk/T), ceil(Nq/T), B*H), block (T, T): one dP_ij per thread.
extern "C" __global__ void attn_naive_bwd_dp(const float* dO, const float* V, float* dP, int Nq,
                                             int Nk, int d, unsigned long long seed,
                                             unsigned long long offset, unsigned threshold,
                                             float inv_keep) {
    const long long bh = blockIdx.z;
    const View A = {dO + bh * Nq * d, d, 1};  // dO: (Nq x d)
    const View Bt = {V + bh * Nk * d, 1, d};  // V^T: (d x Nk), element (c, j) = V[j][c]
    const Dropout none = {0, 0, 0u, 1.0f};
    const float acc = naive_matmul_tile(A, Bt, Nq, Nk, d, none, 0);
    const int i = blockIdx.y * NAIVE_TILE + threadIdx.y, j = blockIdx.x * NAIVE_TILE + threadIdx.x;
    if (i < Nq && j < Nk) {
        const Dropout drop = {seed, offset, threshold, inv_keep};
        const long long e = (bh * Nq + i) * Nk + j;  // also the dropout index of P_ij
        dP[e] = acc * dropout_factor(drop, e);
    }
}

// dS = P * (dP - D): see the header. grid (ceil(Nq / rows), B*H), block (32, rows).
extern "C" __global__ void attn_naive_bwd_ds(const float* P, const float* dP, float* dS, int Nq,
                                             int Nk) {
    // >>> YOUR CODE, step 1 of 1: the body of attn_naive_bwd_ds
    //     The warp's row: D_i over the row's keys, summed over the warp so that every
    //     lane holds it, then dS for the lane's keys.
    // <<< end of step 1
}

// dQ = scale * dS K.  grid (ceil(d/T), ceil(Nq/T), B*H), block (T, T): one dQ_ic per thread.
extern "C" __global__ void attn_naive_bwd_dq(const float* dS, const float* K, float* dQ, int Nq,
                                             int Nk, int d, float scale) {
    const long long bh = blockIdx.z;
    const View A = {dS + bh * Nq * Nk, Nk, 1};  // dS: (Nq x Nk)
    const View B = {K + bh * Nk * d, d, 1};     // K: (Nk x d)
    const Dropout none = {0, 0, 0u, 1.0f};
    const float acc = naive_matmul_tile(A, B, Nq, d, Nk, none, 0);
    const int i = blockIdx.y * NAIVE_TILE + threadIdx.y, c = blockIdx.x * NAIVE_TILE + threadIdx.x;
    if (i < Nq && c < d) dQ[(bh * Nq + i) * d + c] = scale * acc;
}

// dK = scale * dS^T Q.  grid (ceil(d/T), ceil(Nk/T), B*H), block (T, T): one dK_jc per thread.
extern "C" __global__ void attn_naive_bwd_dk(const float* dS, const float* Q, float* dK, int Nq,
                                             int Nk, int d, float scale) {
    const long long bh = blockIdx.z;
    const View At = {dS + bh * Nq * Nk, 1, Nk};  // dS^T: (Nk x Nq), element (j, i) = dS[i][j]
    const View B = {Q + bh * Nq * d, d, 1};      // Q: (Nq x d)
    const Dropout none = {0, 0, 0u, 1.0f};
    const float acc = naive_matmul_tile(At, B, Nk, d, Nq, none, 0);
    const int j = blockIdx.y * NAIVE_TILE + threadIdx.y, c = blockIdx.x * NAIVE_TILE + threadIdx.x;
    if (j < Nk && c < d) dK[(bh * Nk + j) * d + c] = scale * acc;
}
