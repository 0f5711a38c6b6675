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
    // >>> naive_softmax 1: this lane's running (m, l) over its keys
    for (int j = lane; j < Nk; j += WARP) {
        const float x = s[j];
        const float m_new = fmaxf(m, x);
        if (m_new > -INFINITY) {  // skip while everything seen is masked: exp(-inf + inf) = NaN
            l = l * expf(m - m_new) + expf(x - m_new);  // rescale the old sum to the new max
            m = m_new;
        }
    }
    // <<< naive_softmax 1
    // >>> naive_softmax 2: merge the 32 lanes' (m, l) with warp shuffles
    for (int o = WARP / 2; o > 0; o /= 2) {  // merge (m, l) of lanes o apart
        const float m_o = __shfl_xor_sync(FULL_MASK, m, o);
        const float l_o = __shfl_xor_sync(FULL_MASK, l, o);
        const float m_new = fmaxf(m, m_o);
        if (m_new > -INFINITY) {
            l = l * expf(m - m_new) + l_o * expf(m_o - m_new);
            m = m_new;
        }
    }
    // <<< naive_softmax 2
    // >>> naive_softmax 3: P_ij = exp(S_ij - m_i) / l_i (a row that sees no key: P = 0)
    // A row with no visible key has m = -inf and l = 0: subtract 0 and scale by 0 instead, so
    // P = exp(-inf) * 0 = 0 (every S_ij is still read once, as the traffic model counts).
    const float m_ref = m == -INFINITY ? 0.0f : m;
    const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
    float* p = P + row * Nk;
    for (int j = lane; j < Nk; j += WARP) p[j] = expf(s[j] - m_ref) * inv_l;
    // <<< naive_softmax 3
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
