// Exercise naive_ds (lab 03): the store-P backward's dS = P * (dP - D)
// attn_naive_bwd_ds: the softmax's backward, one warp per row i, reading the stored P
// and dP = dO V^T from HBM. D_i = sum_j dP_ij P_ij equals rowsum(dO_i * O_i).
// Fill in the 2 steps marked '>>> YOUR CODE'; everything else is given.
// Check: python -m ckptlab exercise check naive_ds   (--hint 2: a second hint)
// Solution (try first): kernels/attn_naive_bwd.cu, the kernel the labs run.

// attn_naive_bwd.cu: the store-P backward of standard attention, five launches.
//
// Forward (attn_naive_fwd.cu): S = scale * Q K^T; P = softmax(S); O = dropout(P) V.
// Backward, reading the stored P (B, H, Nq, Nk) and regenerating the dropout mask Z:
//   1. attn_naive_bwd_dv   dV = P_dropped^T dO                 from  O = P_dropped V
//   2. attn_naive_bwd_dp   dP = (dO V^T) * Z / (1 - p)         from  O = P_dropped V, dropout
//                          written to HBM                      (B, H, Nq, Nk)
//   3. attn_naive_bwd_ds   dS = P * (dP - D), D_i = sum_j dP_ij P_ij     from P = softmax(S)
//                          written to HBM                      (B, H, Nq, Nk)
//   4. attn_naive_bwd_dq   dQ = scale * dS K                    from  S = scale * Q K^T
//   5. attn_naive_bwd_dk   dK = scale * dS^T Q                  from  S = scale * Q K^T
// Masked entries have P_ij = 0, so dS_ij = 0 there; a row that sees no key has P = 0 and gets
// dQ = 0. Shapes: Q, dQ, O, dO (B, H, Nq, d); K, V, dK, dV (B, H, Nk, d); fp32, contiguous.
//
// Global bytes (fp32, per (b, h), T = NAIVE_TILE; exact formulas in ckptlab/measure/traffic.py):
//   dv: P Nq*Nk*ceil(d/T), dO Nq*d*ceil(Nk/T) read;  dV Nk*d written
//   dp: dO Nq*d*ceil(Nk/T), V Nk*d*ceil(Nq/T) read;  dP Nq*Nk written
//   ds: P and dP 2*Nq*Nk each read (pass 1 for D, pass 2 for dS);  dS Nq*Nk written
//   dq: dS Nq*Nk*ceil(d/T), K Nk*d*ceil(Nq/T) read;  dQ Nq*d written
//   dk: dS Nq*Nk*ceil(d/T), Q Nq*d*ceil(Nk/T) read;  dK Nk*d written
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

// dS_ij = P_ij * (dP_ij - D_i), D_i = sum_j dP_ij P_ij: the softmax backward, one warp per row
// (pass 1 reduces D_i across the warp with shuffles, pass 2 writes dS).
// grid (ceil(Nq / rows), B*H), block (32, rows).
extern "C" __global__ void attn_naive_bwd_ds(const float* P, const float* dP, float* dS, int Nq,
                                             int Nk) {
    const int lane = threadIdx.x, i = blockIdx.x * blockDim.y + threadIdx.y;
    if (i >= Nq) return;  // the whole warp leaves together: no shuffle is skipped
    const long long row = ((long long)blockIdx.y * Nq + i) * Nk;
    float D = 0.0f;
    // >>> YOUR CODE, step 1 of 2: D_i = sum_j dP_ij P_ij, over the whole warp
    //     D_i = sum_j dP_ij P_ij over the whole row i (it equals rowsum(dO_i * O_i)).
    //     Each lane sums the terms of its keys (j = lane, lane + WARP, ...; row i
    //     starts `row` elements into P and dP); the row's sum needs the 32 partial
    //     sums added together, and every lane needs the total for step 2: a reduction
    //     over the warp (common.cuh has one). Updates: D.
    // <<< end of step 1
    // >>> YOUR CODE, step 2 of 2: dS_ij = P_ij (dP_ij - D_i) for this lane's keys
    //     dS_ij = P_ij (dP_ij - D_i) for the lane's keys, into dS at the place P and
    //     dP are read from. Why: the softmax's Jacobian, diag(P_i) - P_i P_i^T,
    //     applied to dP_i.
    // <<< end of step 2
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
