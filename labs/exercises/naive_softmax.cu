// Exercise naive_softmax (lab 02): the naive forward's softmax, writing P to HBM
// attn_naive_softmax: one warp per row i of S (B, H, Nq, Nk), lane j visiting the keys
// j, j + 32, ... You write each lane's running (m, l), the merge of the 32 lanes
// (lab 01's butterfly, here over a row of S) and the pass that writes P. Masked
// scores are -inf in S.
// Fill in the 3 steps marked '>>> YOUR CODE'; everything else is given.
// Check: python -m ckptlab exercise check naive_softmax   (--hint 2: a second hint)
// Solution (try first): kernels/attn_naive_fwd.cu, the kernel the labs run.

// attn_naive_fwd.cu: standard attention forward, three launches, S and P live in HBM.
//
//   1. attn_naive_scores   S = scale * Q K^T, masked entries set to -inf     (B, H, Nq, Nk)
//   2. attn_naive_softmax  P = softmax(S) row by row, max-subtracted        (B, H, Nq, Nk)
//   3. attn_naive_pv       O = dropout(P) V                                 (B, H, Nq, d)
//
// Shapes: Q (B, H, Nq, d), K and V (B, H, Nk, d), all fp32 and contiguous. The batch index
// bh = b*H + h is blockIdx.z (matmuls) or blockIdx.y (softmax).
// Causal masking is aligned to the bottom-right corner: query i sees key j iff
// j <= i + Nk - Nq. A query that sees no key (Nq > Nk) gets P = 0 and O = 0.
// Dropout: P_dropped_ij = P_ij * Z_ij / (1 - p) with Z from Philox (philox.cuh), index
// ((b*H + h)*Nq + i)*Nk + j. P itself is stored undropped; every consumer regenerates Z.
//
// Global bytes (fp32, per (b, h), T = NAIVE_TILE; the exact formulas are ckptlab/measure/traffic.py):
//   scores:  Q  Nq*d*ceil(Nk/T) read,  K  Nk*d*ceil(Nq/T) read,  S  Nq*Nk written
//   softmax: S  2*Nq*Nk read (one pass for m and l, one to write P),  P  Nq*Nk written
//   pv:      P  Nq*Nk*ceil(d/T) read,  V  Nk*d*ceil(Nq/T) read,  O  Nq*d written
// This is the N x N traffic the flash kernels avoid.
#include "common.cuh"

// S = scale * Q K^T, -inf where causal masking hides key j from query i.
// grid (ceil(Nk/T), ceil(Nq/T), B*H), block (T, T): one S_ij per thread.
extern "C" __global__ void attn_naive_scores(const float* Q, const float* K, float* S, int Nq,
                                             int Nk, int d, float scale, int causal) {
    const long long bh = blockIdx.z;
    const View A = {Q + bh * Nq * d, d, 1};   // Q: (Nq x d)
    const View Bt = {K + bh * Nk * d, 1, d};  // K^T: (d x Nk), element (c, j) = K[j][c]
    const Dropout none = {0, 0, 0u, 1.0f};
    const float acc = naive_matmul_tile(A, Bt, Nq, Nk, d, none, 0);
    const int i = blockIdx.y * NAIVE_TILE + threadIdx.y, j = blockIdx.x * NAIVE_TILE + threadIdx.x;
    if (i < Nq && j < Nk) {
        const bool visible = !causal || j <= i + Nk - Nq;
        S[(bh * Nq + i) * Nk + j] = visible ? scale * acc : -INFINITY;  // S_ij
    }
}

// P_ij = exp(S_ij - m_i) / l_i, m_i = max_j S_ij, l_i = sum_j exp(S_ij - m_i).
// One warp per row: pass 1 keeps a running (m, l) per lane (online softmax, so exp never
// sees a positive argument and |S| ~ 1e4 cannot overflow), merges the 32 lanes with
// shuffles; pass 2 writes P.
// grid (ceil(Nq / rows), B*H), block (32, rows).
extern "C" __global__ void attn_naive_softmax(const float* S, float* P, int Nq, int Nk) {
    const int lane = threadIdx.x, i = blockIdx.x * blockDim.y + threadIdx.y;
    if (i >= Nq) return;  // the whole warp leaves together: no barrier or shuffle is skipped
    const long long row = (long long)blockIdx.y * Nq + i;
    const float* s = S + row * Nk;
    float m = -INFINITY, l = 0.0f;
    // >>> YOUR CODE, step 1 of 3: this lane's running (m, l) over its keys
    //     Each lane keeps the online softmax state of its keys (j = lane, lane + WARP,
    //     ...; s points at row i of S): m, the largest score seen so far, and l, the
    //     sum of exp(S_ij - m) over them, brought to the new max (a factor e^(m_old -
    //     m_new)) whenever m grows. Pitfall: masked scores are -inf; while everything
    //     a lane has seen is -inf, -inf - (-inf) would be NaN: leave (m, l) as they
    //     are until a finite score arrives. Updates: m, l.
    // <<< end of step 1
    // >>> YOUR CODE, step 2 of 3: merge the 32 lanes' (m, l) with warp shuffles
    //     Merge the 32 lanes' (m, l) so that every lane holds the row's: lab 01's
    //     butterfly, five rounds of a shuffle by xor, each lane keeping the larger max
    //     and the sum of both sums brought to it. Pitfall: a lane that saw only -inf
    //     (or no key: Nk < 32) has m = -inf and l = 0, and must add 0 to the merged
    //     sum, not NaN. Updates: m, l, in every lane.
    // <<< end of step 2
    // >>> YOUR CODE, step 3 of 3: P_ij = exp(S_ij - m_i) / l_i (a row that sees no key: P = 0)
    //     P_ij = exp(S_ij - m_i) / l_i for the lane's keys j, written to row i of P
    //     (it starts row * Nk elements into P, as s does into S); 1 / l once per row,
    //     not a division per key. Pitfall: a row that sees no key (causal, Nq > Nk)
    //     has m = -inf and l = 0: its P is 0, so it subtracts 0 instead of m and
    //     scales by 0 instead of 1 / l (every S_ij is still read once, as the traffic
    //     model counts).
    // <<< end of step 3
}

// O = dropout(P) V: the dropout factor is applied to P as its tiles are loaded.
// grid (ceil(d/T), ceil(Nq/T), B*H), block (T, T): one O_ic per thread.
extern "C" __global__ void attn_naive_pv(const float* P, const float* V, float* O, int Nq, int Nk,
                                         int d, unsigned long long seed, unsigned long long offset,
                                         unsigned threshold, float inv_keep) {
    const long long bh = blockIdx.z;
    const View A = {P + bh * Nq * Nk, Nk, 1};  // P: (Nq x Nk)
    const View B = {V + bh * Nk * d, d, 1};    // V: (Nk x d)
    const Dropout drop = {seed, offset, threshold, inv_keep};
    const float acc = naive_matmul_tile(A, B, Nq, d, Nk, drop, bh * Nq * Nk);
    const int i = blockIdx.y * NAIVE_TILE + threadIdx.y, c = blockIdx.x * NAIVE_TILE + threadIdx.x;
    if (i < Nq && c < d) O[(bh * Nq + i) * d + c] = acc;  // O_ic = sum_j P_dropped_ij V_jc
}
