// attn_flash_fwd.cu: FlashAttention forward. Tiled, online softmax; with STORED, also the
// scores S of every visited tile to HBM (the store-P method's forward).
//
//   S = scale * Q K^T,  P = softmax(S),  O = dropout(P) V,  L_i = m_i + log l_i
//
// One block owns Br query rows of one (b, h) and streams the Tc = ceil(Nk/Bc) tiles of K and V
// through shared memory. For each tile it computes S_ij (Br x Bc) in registers, and updates
// the running row max m_i and row sum l_i (online softmax):
//   m_new = max(m, max_j S_ij),  alpha = exp(m - m_new)
//   l     = alpha * l + sum_j exp(S_ij - m_new)
//   acc   = alpha * acc + dropout(exp(S - m_new)) V_j
// and at the end writes O_i = acc / l and L_i = m + log l. Exponents are never positive, so
// |S| ~ 1e4 cannot overflow. L is all the flash backward needs to recompute P = exp(S - L).
//
// Two methods, one kernel; the template switch STORED is the only difference between them:
//   STORED = false  flash: nothing N x N leaves the chip; the backward recomputes S = Q K^T.
//   STORED = true   stored: each visible S_ij is also written to S (B, H, Nq, Nk) in the same
//                   single pass, from the registers that hold it (Q K^T runs once). It stores
//                   the scores S, not P: P = exp(S - L) needs L, known only when the pass
//                   ends; the backward reads S back and forms P = exp(S - L) without Q K^T.
//                   Entries that are masked (causal) or in a skipped tile are never written.
//
// Shapes: Q, O (B, H, Nq, d); K, V (B, H, Nk, d); L (B, H, Nq); S (B, H, Nq, Nk) or empty;
// fp32, contiguous. Template: Dt (tile head dim >= d, see common.cuh), Br (query rows per
// block), Bc (keys per tile), STORED; Br, Bc multiples of LANES. grid (Tr = ceil(Nq/Br), B*H),
// block (LANES, Br): row group r = threadIdx.y owns query i = q0 + r; its lane owns the S
// columns j = lane + c*LANES and the O columns lane + c*LANES.
// Causal (bottom-right aligned): i sees j iff j <= i + Nk - Nq; key tiles wholly to the right
// of the block's last row are skipped. A row that sees no key gets O = 0 and L = +inf (as in
// FlashAttention 2), so that exp(S - L) = 0 in the backward.
// Dropout: P_dropped_ij = P_ij * Z_ij / (1 - p), Z from Philox at ((b*H + h)*Nq + i)*Nk + j;
// l sums the undropped P, so L is the softmax's logsumexp with or without dropout.
//
// Global bytes per (b, h): Q Nq*d read once; K and V: each visited tile's rows, d each, for
// every query tile (Tr*Nk*d each when not causal); O Nq*d and L Nq written; with STORED, S
// one float per visible (i, j). Shared memory: 4 * (Br*(Dt+1) + Bc*(Dt+1) + Bc*Dt +
// Br*(Bc+1)) bytes (ckptlab/kernels/table.py checks the 48 KiB budget).
#include "common.cuh"

template <int Dt, int Br, int Bc, bool STORED>
__global__ void __launch_bounds__(Br * LANES) attn_flash_fwd(const float* Q, const float* K, const float* V, float* O, float* L,
                               float* S, int Nq, int Nk, int d, float scale, int causal,
                               unsigned long long seed, unsigned long long offset,
                               unsigned threshold, float inv_keep) {
    static_assert(Dt % LANES == 0 && Dt <= MAX_HEAD_DIM, "tile head dim");
    static_assert(Bc % LANES == 0 && Br % (WARP / LANES) == 0, "tile sizes");
    __shared__ float Qs[Br][Dt + 1];  // +1: lanes reading different rows at one k hit distinct banks
    __shared__ float Ks[Bc][Dt + 1];
    __shared__ float Vs[Bc][Dt];
    __shared__ float Ps[Br][Bc + 1];  // dropped P of this tile, one row per row group

    const int lane = threadIdx.x, r = threadIdx.y;
    const int tid = r * LANES + lane, nthreads = Br * LANES;
    const long long bh = blockIdx.y;
    const int q0 = blockIdx.x * Br, i = q0 + r;
    const float* Kb = K + bh * Nk * d;
    const float* Vb = V + bh * Nk * d;
    const Dropout drop = {seed, offset, threshold, inv_keep};

    // Q_i: Br x d, loaded once; rows past Nq are zero and see no key (harmless -inf scores)
    load_rows<Dt, Br>(Qs, Q + bh * Nq * d, q0, Nq, d, tid, nthreads);

    // key tiles this block visits: all, or (causal) up to the last key its last row sees
    const int Tc = ceil_div(Nk, Bc);
    int n_tiles = Tc;
    if (causal) {
        const int last_key = min(q0 + Br, Nq) - 1 + Nk - Nq;
        n_tiles = last_key < 0 ? 0 : min(Tc, last_key / Bc + 1);
    }

    float m = -INFINITY, l = 0.0f;  // running row max and row sum of row i
    float acc[Dt / LANES];          // O_i columns lane + c*LANES, unnormalised
    for (int c = 0; c < Dt / LANES; ++c) acc[c] = 0.0f;

    for (int t = 0; t < n_tiles; ++t) {
        const int k0 = t * Bc;
        __syncthreads();  // all reads of the previous K_j, V_j are done before we overwrite them
        load_rows<Dt, Bc>(Ks, Kb, k0, Nk, d, tid, nthreads);  // K_j, V_j: Bc x d; 0 past Nk
        load_rows<Dt, Bc>(Vs, Vb, k0, Nk, d, tid, nthreads);
        __syncthreads();  // K_j and V_j (and, on the first tile, Q_i) are in shared memory

        // S_ij = scale * q_i . k_j for this lane's columns; masked or out of range -> -inf
        float s[Bc / LANES];
        float m_tile = -INFINITY;
        for (int c = 0; c < Bc / LANES; ++c) {
            const int jj = lane + c * LANES, j = k0 + jj;
            // >>> flash_forward 1: S_ij = scale * q_i . k_j where i sees j, else -inf
            float dot = 0.0f;
            for (int k = 0; k < Dt; ++k) dot += Qs[r][k] * Ks[jj][k];
            const bool seen = visible(i, j, Nq, Nk, causal);
            s[c] = seen ? scale * dot : -INFINITY;
            // <<< flash_forward 1
            // stored: S_ij to HBM once, from this register; the backward reads it back
            if (STORED && seen) S[(bh * Nq + i) * Nk + j] = s[c];
            m_tile = fmaxf(m_tile, s[c]);
        }
        // >>> flash_forward 2: the online softmax: m, alpha, l, and this tile's P
        const float m_new = fmaxf(m, group_max<LANES>(m_tile));
        // while row i has seen no visible key m_new = -inf: subtract 0 so exp gives 0, not NaN
        const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
        const float alpha = expf(m - m_ref);  // rescales what was summed under the old max
        float l_tile = 0.0f;
        for (int c = 0; c < Bc / LANES; ++c) {
            const int jj = lane + c * LANES, j = k0 + jj;
            const float p = expf(s[c] - m_ref);  // P_ij * l_i (unnormalised)
            l_tile += p;
            const float z = p > 0.0f ? dropout_factor(drop, (bh * Nq + i) * Nk + j) : 0.0f;
            Ps[r][jj] = p * z;
        }
        l = alpha * l + group_sum<LANES>(l_tile);
        m = m_new;
        // <<< flash_forward 2
        __syncwarp();  // row r of Ps was written by its own row group (one warp); now read it

        // >>> flash_forward 3: rescale the accumulator and add this tile's P V
        // acc_i = alpha * acc_i + sum_j P_dropped_ij V_jc
        for (int c = 0; c < Dt / LANES; ++c) {
            const int col = lane + c * LANES;
            float pv = 0.0f;
            for (int jj = 0; jj < Bc; ++jj) pv += Ps[r][jj] * Vs[jj][col];
            acc[c] = alpha * acc[c] + pv;
        }
        // <<< flash_forward 3
    }

    if (i < Nq) {
        // >>> flash_forward 4: O_i = acc_i / l_i and L_i = m_i + log l_i
        const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;  // a row that saw no key: O = 0
        for (int c = 0; c < Dt / LANES; ++c) {
            const int col = lane + c * LANES;
            if (col < d) O[(bh * Nq + i) * d + col] = acc[c] * inv_l;  // padded columns: not stored
        }
        if (lane == 0) L[bh * Nq + i] = l > 0.0f ? m + logf(l) : INFINITY;  // L_i = m_i + log l_i
        // <<< flash_forward 4
    }
}
