// attn_flash_fwd_tc.cu: FlashAttention forward on tensor cores: 16-bit storage (T = __half or
// __nv_bfloat16), wmma matmuls with fp32 accumulators, fp32 softmax statistics. With STORED,
// also the scores S of every visited tile to HBM (the store-P method's forward).
//
//   S = scale * Q K^T,  P = softmax(S),  O = dropout(P) V,  L_i = m_i + log l_i
//
// The algorithm of attn_flash_fwd.cu (read it first), with the two matmuls on tensor cores:
// one block owns Br query rows of one (b, h) and streams the Tc = ceil(Nk/Bc) tiles of K, V
// through shared memory. Warp w owns the 16-row strip w of the Q tile. Per key tile:
//   S_strip   = Q_strip K_j^T            wmma, fp32 accumulators, stored to shared memory
//   m_new     = max(m, max_j S_ij),  alpha = exp(m - m_new),  l = alpha l + sum_j exp(S_ij - m_new)
//   O_strip   = alpha O_strip            fp32, in shared memory (lanes know the rows there)
//   O_strip  += P_dropped V_j            wmma, P_dropped rounded to T as the matmul's input
// and at the end O_i = O_i / l_i (rounded to T) and L_i = m_i + log l_i (fp32). A lane pair
// (lanes 2r, 2r+1 of the warp) owns row r of the strip in the softmax: its m and l.
//
// Two methods, one kernel; the template switch STORED is the only difference between them:
//   STORED = false  flash: nothing N x N leaves the chip; the backward recomputes S = Q K^T.
//   STORED = true   stored: each visible S_ij is also written to S (B, H, Nq, Nk) in the same
//                   single pass (Q K^T runs once). The scores, not P: P = exp(S - L) needs L,
//                   known only when the pass ends. Masked entries are never written. S is fp32,
//                   as the accumulator holds it: the backward then forms the very P the flash
//                   backward recomputes (bit for bit), and stored and flash differ only in where
//                   S comes from. (In 16 bits, exp(S - L) would turn S's rounding, |S| 2^-9 for
//                   bf16, into P's relative error: measured up to 2.3x PyTorch's bf16 error.)
//
// Shapes: Q, O (B, H, Nq, d); K, V (B, H, Nk, d): T, contiguous; S (B, H, Nq, Nk) or empty and
// L (B, H, Nq): fp32. Template: T, Dt (tile head dim: d rounded up to a multiple of 16, the
// padded columns are zero in shared memory and never touch global memory), Br, Bc (multiples
// of 16), STORED. grid (Tr = ceil(Nq/Br), B*H), block (32 * Br/16), dynamic shared memory
// FwdSmem<T, Dt, Br, Bc>::bytes (tc_common.cuh). Causal is bottom-right aligned; a row that
// sees no key gets O = 0 and L = +inf; dropout regenerates Z from Philox at
// ((b*H + h)*Nq + i)*Nk + j, exactly as attn_flash_fwd.cu.
//
// Global bytes per (b, h), sizeof(T) each: Q Nq*d read once; K and V each visited tile's rows
// (d each) for every query tile; O Nq*d written; L Nq floats; with STORED, S one float per
// visible (i, j). Half the fp32 kernel's bytes but for S, the same FLOPs.
#include "tc_common.cuh"

template <class T, int Dt, int Br, int Bc, bool STORED>
__global__ void __launch_bounds__(Br / TC * WARP) attn_flash_fwd_tc(
    const T* Q, const T* K, const T* V, T* O, float* L, float* S, int Nq, int Nk, int d, float scale,
    int causal, unsigned long long seed, unsigned long long offset, unsigned threshold,
    float inv_keep) {
    static_assert(Dt % TC == 0 && Br % TC == 0 && Bc % TC == 0, "tiles are multiples of 16");
    using Sm = FwdSmem<T, Dt, Br, Bc>;
    constexpr int LDT = Sm::LDT, LDS = Sm::LDS, LDP = Sm::LDP, LDO = Sm::LDO;
    extern __shared__ __align__(128) unsigned char smem[];
    T* Qs = reinterpret_cast<T*>(smem + Sm::Q);    // Qs[r * LDT + c] = Q_i[r][c]
    T* Ks = reinterpret_cast<T*>(smem + Sm::K);
    T* Vs = reinterpret_cast<T*>(smem + Sm::V);
    float* Ss = reinterpret_cast<float*>(smem + Sm::S);  // scores of this tile
    T* Ps = reinterpret_cast<T*>(smem + Sm::Pd);         // P_dropped of this tile
    float* Os = reinterpret_cast<float*>(smem + Sm::O);  // O_i, unnormalised

    const int tid = threadIdx.x, w = tid / WARP, lane = tid % WARP, nthreads = Br / TC * WARP;
    const int r = TC * w + lane / 2, half = lane % 2;  // this lane's row of the strip, and half
    const long long bh = blockIdx.y;
    const int q0 = blockIdx.x * Br, i = q0 + r;
    const T* Kb = K + bh * Nk * d;
    const T* Vb = V + bh * Nk * d;
    const Dropout drop = {seed, offset, threshold, inv_keep};

    // Q_i once (zero past Nq and d); this warp's strip of O starts at 0
    load_tile<T, Dt>(Qs, LDT, Q + bh * Nq * d, q0, Br, Nq, d, tid, nthreads);
    for (int e = lane; e < TC * Dt; e += WARP) Os[(TC * w + e / Dt) * LDO + e % Dt] = 0.0f;

    // key tiles this block visits: all, or (causal) up to the last key its last row sees
    const int Tc = ceil_div(Nk, Bc);
    int n_tiles = Tc;
    if (causal) {
        const int last_key = min(q0 + Br, Nq) - 1 + Nk - Nq;
        n_tiles = last_key < 0 ? 0 : min(Tc, last_key / Bc + 1);
    }

    float m = -INFINITY, l = 0.0f;  // running row max and row sum of row i (both lanes)
    for (int t = 0; t < n_tiles; ++t) {
        const int k0 = t * Bc;
        __syncthreads();  // all reads of the previous K_j, V_j are done before we overwrite them
        load_tile<T, Dt>(Ks, LDT, Kb, k0, Bc, Nk, d, tid, nthreads);  // K_j, V_j: 0 past Nk
        load_tile<T, Dt>(Vs, LDT, Vb, k0, Bc, Nk, d, tid, nthreads);
        __syncthreads();  // K_j and V_j (and, on the first tile, Q_i) are in shared memory

        // S_strip = Q_strip K_j^T: K_j read as column-major K^T
        for (int nb = 0; nb < Bc / TC; ++nb) {
            Acc acc;
            wmma::fill_fragment(acc, 0.0f);
            mma_k<T, wmma::row_major, wmma::col_major>(acc, Qs + TC * w * LDT, LDT,
                                                       Ks + TC * nb * LDT, LDT, Dt / TC);
            wmma::store_matrix_sync(Ss + TC * w * LDS + TC * nb, acc, LDS, wmma::mem_row_major);
        }
        __syncwarp();  // the strip's scores are in shared memory; lanes now read whole rows

        // S_ij = scale * q_i . k_j; masked or out of range -> -inf; stored: S_ij to HBM, once
        float m_tile = -INFINITY;
        for (int c = half; c < Bc; c += 2) {
            const int j = k0 + c;
            const bool seen = visible(i, j, Nq, Nk, causal);
            const float s = seen ? scale * Ss[r * LDS + c] : -INFINITY;
            if (STORED && seen) S[(bh * Nq + i) * Nk + j] = s;
            Ss[r * LDS + c] = s;
            m_tile = fmaxf(m_tile, s);
        }
        const float m_new = fmaxf(m, group_max<2>(m_tile));
        // while row i has seen no visible key m_new = -inf: subtract 0 so exp gives 0, not NaN
        const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
        const float alpha = expf(m - m_ref);  // rescales what was summed under the old max
        float l_tile = 0.0f;
        for (int c = half; c < Bc; c += 2) {
            const float p = expf(Ss[r * LDS + c] - m_ref);  // P_ij * l_i (unnormalised)
            l_tile += p;
            const float z = p > 0.0f ? dropout_factor(drop, (bh * Nq + i) * Nk + k0 + c) : 0.0f;
            Ps[r * LDP + c] = from_float<T>(p * z);  // rounded to T: the P V matmul's input
        }
        l = alpha * l + group_sum<2>(l_tile);
        m = m_new;
        for (int c = half; c < Dt; c += 2) Os[r * LDO + c] *= alpha;  // O_i = alpha O_i
        __syncwarp();  // the strip's P_dropped and rescaled O are complete

        // O_strip += P_dropped_strip V_j
        for (int cb = 0; cb < Dt / TC; ++cb) {
            Acc acc;
            wmma::load_matrix_sync(acc, Os + TC * w * LDO + TC * cb, LDO, wmma::mem_row_major);
            mma_k<T, wmma::row_major, wmma::row_major>(acc, Ps + TC * w * LDP, LDP,
                                                       Vs + TC * cb, LDT, Bc / TC);
            wmma::store_matrix_sync(Os + TC * w * LDO + TC * cb, acc, LDO, wmma::mem_row_major);
        }
    }
    __syncwarp();  // the last O strip stores (by every lane) are done before lanes read rows

    if (i < Nq) {
        const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;  // a row that saw no key: O = 0
        for (int c = half; c < d; c += 2)
            O[(bh * Nq + i) * d + c] = from_float<T>(Os[r * LDO + c] * inv_l);
        if (half == 0) L[bh * Nq + i] = l > 0.0f ? m + logf(l) : INFINITY;  // L_i = m_i + log l_i
    }
}
