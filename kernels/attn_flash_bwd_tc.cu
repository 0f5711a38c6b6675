// attn_flash_bwd_tc.cu: FlashAttention backward on tensor cores (P recomputed from L) and, with
// STORED, the store-P backward (P formed from the scores S the forward stored). 16-bit storage
// T (__half or __nv_bfloat16), wmma matmuls with fp32 accumulators, fp32 L, D and softmax math.
//
// The math of attn_flash_bwd.cu (read it first), per (i, j) of a tile pair:
//   S_ij  = scale q_i . k_j   (flash: recomputed)  or  S_ij read from HBM (stored)
//   P_ij  = exp(S_ij - L_i)                       from P = softmax(S), L = logsumexp
//   dV_j += sum_i P_dropped_ij dO_i               from O = P_dropped V
//   dP_ij = (dO_i . V_j) * Z_ij / (1 - p)         from O = P_dropped V and the dropout
//   dS_ij = P_ij (dP_ij - D_i)                    from P = softmax(S)
//   dK_j += scale * sum_i dS_ij Q_i               from S = scale * Q K^T
//   dQ_i += scale * sum_j dS_ij K_j               from S = scale * Q K^T
// The five matmuls (S, dP, dV, dK, dQ) run on tensor cores; P_dropped and dS are rounded to T
// where they become a matmul's input; everything elementwise is fp32.
//
// Kernels (grid and tiles as in attn_flash_bwd.cu; a warp owns a 16-row strip):
//   attn_flash_bwd_preprocess_tc  D = rowsum(dO * O) (fp32, from T); unless deterministic,
//                                 zeroes dQacc, the fp32 buffer the atomics accumulate into
//   attn_flash_bwd_dkdv_tc        one block per K/V tile (warp w: keys 16w..16w+15), inner loop
//                                 over Q tiles; dK, dV accumulate in fp32 shared memory; unless
//                                 DETERMINISTIC it adds each tile's dQ to dQacc with atomicAdd
//   attn_flash_bwd_dq_tc          the deterministic dQ: one block per Q tile (warp w: rows
//                                 16w..16w+15) loops over K/V tiles, forms P and dP again,
//                                 writes dQ (T) once
//   attn_flash_bwd_dq_convert_tc  the atomic path's last step: dQ (T) = dQacc (fp32), as
//                                 FlashAttention 2's convert_dQ
// STORED is the only difference between the two methods: where S comes from (recomputed as
// scale Q K^T, 2 d FLOPs per (i, j); or read, one fp32 per visible (i, j): the same values).
//
// Shapes: Q, dQ, O, dO (B, H, Nq, d); K, V, dK, dV (B, H, Nk, d): T. S (B, H, Nq, Nk) or
// empty, L, D (B, H, Nq), dQacc (B, H, Nq, d): fp32. Template: T, Dt (d rounded up to a multiple of
// 16), Br, Bc (multiples of 16). Dynamic shared memory: BwdSmem / DqSmem (tc_common.cuh).
// Global bytes: those of attn_flash_bwd.cu with sizeof(T) per element of Q, K, V, dO, O, S
// and the gradients; S, L, D, dQacc and dQacc's atomics stay 4 bytes (exact formulas in
// ckptlab/measure/traffic_tc.py).
#include "tc_common.cuh"

// D_i = sum_c dO_ic O_ic, one warp per row of the flattened (B*H*Nq, d) arrays; unless
// deterministic, also dQacc_i = 0. grid (ceil(rows / warps)), block (32, warps).
template <class T>
__global__ void attn_flash_bwd_preprocess_tc(const T* O, const T* dO, float* D, float* dQacc,
                                             int rows, int d, int deterministic) {
    const int lane = threadIdx.x, row = blockIdx.x * blockDim.y + threadIdx.y;
    if (row >= rows) return;  // the whole warp leaves together: no shuffle is skipped
    const long long base = (long long)row * d;
    float acc = 0.0f;
    for (int c = lane; c < d; c += WARP) acc += to_float(dO[base + c]) * to_float(O[base + c]);
    acc = group_sum<WARP>(acc);
    if (lane == 0) D[row] = acc;
    if (!deterministic)
        for (int c = lane; c < d; c += WARP) dQacc[base + c] = 0.0f;
}

// dQ = dQacc rounded to T, n elements.
template <class T>
__global__ void attn_flash_bwd_dq_convert_tc(const float* dQacc, T* dQ, long long n) {
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e < n) dQ[e] = from_float<T>(dQacc[e]);
}

// grid (Tc = ceil(Nk/Bc), B*H), block (32 * Bc/16): warp w owns keys j = k0 + 16w .. +15.
template <class T, int Dt, int Br, int Bc, bool DETERMINISTIC, bool STORED>
__global__ void __launch_bounds__(Bc / TC * WARP) attn_flash_bwd_dkdv_tc(
    const T* Q, const T* K, const T* V, const T* dO, const float* L, const float* D, const float* S,
    float* dQacc, T* dK, T* dV, int Nq, int Nk, int d, float scale, int causal,
    unsigned long long seed, unsigned long long offset, unsigned threshold, float inv_keep) {
    static_assert(Dt % TC == 0 && Br % TC == 0 && Bc % TC == 0, "tiles are multiples of 16");
    using Sm = BwdSmem<T, Dt, Br, Bc>;
    constexpr int LDT = Sm::LDT, LDS = Sm::LDS, LDP = Sm::LDP, LDO = Sm::LDO;
    extern __shared__ __align__(128) unsigned char smem[];
    T* Ks = reinterpret_cast<T*>(smem + Sm::K);
    T* Vs = reinterpret_cast<T*>(smem + Sm::V);
    T* Qs = reinterpret_cast<T*>(smem + Sm::Q);
    T* dOs = reinterpret_cast<T*>(smem + Sm::dO);
    float* Ss = reinterpret_cast<float*>(smem + Sm::S);    // S of the tile pair
    float* dPs = reinterpret_cast<float*>(smem + Sm::dP);  // (dO V^T) of the tile pair
    float* dQs = reinterpret_cast<float*>(smem + Sm::S);   // the atomic dQ tile, over S and dP
    T* Pd = reinterpret_cast<T*>(smem + Sm::Pd);           // P_dropped, for dV
    T* dSs = reinterpret_cast<T*>(smem + Sm::dS);          // dS, for dK and dQ
    float* dKs = reinterpret_cast<float*>(smem + Sm::dK);  // dK_j, dV_j accumulators
    float* dVs = reinterpret_cast<float*>(smem + Sm::dV);
    float* Ls = reinterpret_cast<float*>(smem + Sm::L);
    float* Ds = reinterpret_cast<float*>(smem + Sm::D);

    const int tid = threadIdx.x, w = tid / WARP, lane = tid % WARP, nthreads = Bc / TC * WARP;
    const int jj = TC * w + lane % TC;  // this lane's key column of the tile, in elementwise steps
    const long long bh = blockIdx.y;
    const int k0 = blockIdx.x * Bc, j = k0 + jj;
    const Dropout drop = {seed, offset, threshold, inv_keep};

    // K_j, V_j: once. K_j serves S = scale Q K^T (flash) and the atomic dQ += dS K only, so the
    // stored deterministic kernel does not load it
    if (!STORED || !DETERMINISTIC) load_tile<T, Dt>(Ks, LDT, K + bh * Nk * d, k0, Bc, Nk, d, tid, nthreads);
    load_tile<T, Dt>(Vs, LDT, V + bh * Nk * d, k0, Bc, Nk, d, tid, nthreads);
    for (int e = lane; e < TC * Dt; e += WARP) {  // this warp's strips of dK_j, dV_j start at 0
        dKs[(TC * w + e / Dt) * LDO + e % Dt] = 0.0f;
        dVs[(TC * w + e / Dt) * LDO + e % Dt] = 0.0f;
    }

    // Q tiles that see any key of this tile: all, or (causal) from the first row that sees k0
    const int Tr = ceil_div(Nq, Br);
    int a0 = 0;
    if (causal) {
        const int i0 = k0 - (Nk - Nq);  // first query row that sees key k0
        a0 = i0 > Nq - 1 ? Tr : max(i0, 0) / Br;
    }

    for (int a = a0; a < Tr; ++a) {
        const int q0 = a * Br;
        __syncthreads();  // the previous tile pair's reads are done (first pass: K_j, V_j loaded)
        load_tile<T, Dt>(Qs, LDT, Q + bh * Nq * d, q0, Br, Nq, d, tid, nthreads);
        load_tile<T, Dt>(dOs, LDT, dO + bh * Nq * d, q0, Br, Nq, d, tid, nthreads);
        load_vec_tc(Ls, L + bh * Nq, q0, Br, Nq, tid, nthreads);
        load_vec_tc(Ds, D + bh * Nq, q0, Br, Nq, tid, nthreads);
        if (STORED) load_scores_tc(Ss, LDS, S + bh * Nq * Nk, q0, k0, Br, Bc, Nq, Nk, causal, tid, nthreads);
        __syncthreads();  // Q_i, dO_i, L_i, D_i (stored: S_ij) are in shared memory

        // this warp's key strip: S (flash) and dO V^T, for every 16 query rows of the tile
        for (int qb = 0; qb < Br / TC; ++qb) {
            Acc acc;
            if (!STORED) {  // S_ij / scale = q_i . k_j, K_j read as column-major K^T
                wmma::fill_fragment(acc, 0.0f);
                mma_k<T, wmma::row_major, wmma::col_major>(acc, Qs + TC * qb * LDT, LDT,
                                                           Ks + TC * w * LDT, LDT, Dt / TC);
                wmma::store_matrix_sync(Ss + TC * qb * LDS + TC * w, acc, LDS, wmma::mem_row_major);
            }
            wmma::fill_fragment(acc, 0.0f);  // (dO V^T)_ij = dO_i . v_j
            mma_k<T, wmma::row_major, wmma::col_major>(acc, dOs + TC * qb * LDT, LDT,
                                                       Vs + TC * w * LDT, LDT, Dt / TC);
            wmma::store_matrix_sync(dPs + TC * qb * LDS + TC * w, acc, LDS, wmma::mem_row_major);
        }
        __syncwarp();  // the strip's S and dP are in shared memory; lanes now read them

        for (int ii = lane / TC; ii < Br; ii += WARP / TC) {
            const int i = q0 + ii;
            // S_ij: read back (stored) or recomputed (flash), then P_ij = exp(S_ij - L_i)
            const float s = STORED ? Ss[ii * LDS + jj] : scale * Ss[ii * LDS + jj];
            const float p = tc_visible(i, j, Nq, Nk, causal) ? expf(s - Ls[ii]) : 0.0f;
            const float z = p > 0.0f ? dropout_factor(drop, (bh * Nq + i) * Nk + j) : 0.0f;
            Pd[ii * LDP + jj] = from_float<T>(p * z);
            dSs[ii * LDP + jj] = from_float<T>(p * (dPs[ii * LDS + jj] * z - Ds[ii]));  // dS = P (dP - D)
        }
        __syncwarp();  // the strip's P_dropped and dS are complete

        // dV_j += P_dropped^T dO_i,  dK_j += dS^T Q_i  (P^T, dS^T: the strips read column-major)
        for (int cb = 0; cb < Dt / TC; ++cb) {
            Acc acc;
            wmma::load_matrix_sync(acc, dVs + TC * w * LDO + TC * cb, LDO, wmma::mem_row_major);
            mma_k<T, wmma::col_major, wmma::row_major>(acc, Pd + TC * w, LDP, dOs + TC * cb, LDT,
                                                       Br / TC);
            wmma::store_matrix_sync(dVs + TC * w * LDO + TC * cb, acc, LDO, wmma::mem_row_major);
            wmma::load_matrix_sync(acc, dKs + TC * w * LDO + TC * cb, LDO, wmma::mem_row_major);
            mma_k<T, wmma::col_major, wmma::row_major>(acc, dSs + TC * w, LDP, Qs + TC * cb, LDT,
                                                       Br / TC);
            wmma::store_matrix_sync(dKs + TC * w * LDO + TC * cb, acc, LDO, wmma::mem_row_major);
        }

        if (!DETERMINISTIC) {  // dQ_i += scale * dS K_j: blocks (qb, cb) of the tile, by warp
            __syncthreads();  // dS is complete (every strip), and S, dP (under dQs) are dead
            constexpr int blocks = Br / TC * (Dt / TC);
            for (int b = w; b < blocks; b += Bc / TC) {
                const int qb = b / (Dt / TC), cb = b % (Dt / TC);
                Acc acc;
                wmma::fill_fragment(acc, 0.0f);
                mma_k<T, wmma::row_major, wmma::row_major>(acc, dSs + TC * qb * LDP, LDP,
                                                           Ks + TC * cb, LDT, Bc / TC);
                wmma::store_matrix_sync(dQs + TC * qb * LDO + TC * cb, acc, LDO, wmma::mem_row_major);
            }
            __syncwarp();  // this warp's dQ blocks are in shared memory
            for (int b = w; b < blocks; b += Bc / TC) {
                const int qb = b / (Dt / TC), cb = b % (Dt / TC);
                for (int e = lane; e < TC * TC; e += WARP) {
                    const int ii = TC * qb + e / TC, c = TC * cb + e % TC;
                    if (q0 + ii < Nq && c < d)
                        atomicAdd(&dQacc[(bh * Nq + q0 + ii) * d + c], scale * dQs[ii * LDO + c]);
                }
            }
        }
    }
    __syncwarp();  // this warp's last dK, dV stores are done before lanes read whole rows

    for (int e = lane; e < TC * d; e += WARP) {  // every key row is written, also unseen ones
        const int y = TC * w + e / d, c = e % d;
        if (k0 + y >= Nk) break;
        const long long g = (bh * Nk + k0 + y) * d + c;
        dK[g] = from_float<T>(scale * dKs[y * LDO + c]);
        dV[g] = from_float<T>(dVs[y * LDO + c]);
    }
}

// Deterministic dQ. grid (Tr = ceil(Nq/Br), B*H), block (32 * Br/16): warp w owns query rows
// i = q0 + 16w .. +15; lane pair (2r, 2r+1) the row r of the strip in elementwise steps.
template <class T, int Dt, int Br, int Bc, bool STORED>
__global__ void __launch_bounds__(Br / TC * WARP) attn_flash_bwd_dq_tc(
    const T* Q, const T* K, const T* V, const T* dO, const float* L, const float* D, const float* S,
    T* dQ, int Nq, int Nk, int d, float scale, int causal, unsigned long long seed,
    unsigned long long offset, unsigned threshold, float inv_keep) {
    static_assert(Dt % TC == 0 && Br % TC == 0 && Bc % TC == 0, "tiles are multiples of 16");
    using Sm = DqSmem<T, Dt, Br, Bc>;
    constexpr int LDT = Sm::LDT, LDS = Sm::LDS, LDP = Sm::LDP, LDO = Sm::LDO;
    extern __shared__ __align__(128) unsigned char smem[];
    T* Qs = reinterpret_cast<T*>(smem + Sm::Q);
    T* dOs = reinterpret_cast<T*>(smem + Sm::dO);
    T* Ks = reinterpret_cast<T*>(smem + Sm::K);
    T* Vs = reinterpret_cast<T*>(smem + Sm::V);
    float* Ss = reinterpret_cast<float*>(smem + Sm::S);
    float* dPs = reinterpret_cast<float*>(smem + Sm::dP);
    T* dSs = reinterpret_cast<T*>(smem + Sm::dS);
    float* dQs = reinterpret_cast<float*>(smem + Sm::dQ);  // dQ_i accumulator
    float* Ls = reinterpret_cast<float*>(smem + Sm::L);
    float* Ds = reinterpret_cast<float*>(smem + Sm::D);

    const int tid = threadIdx.x, w = tid / WARP, lane = tid % WARP, nthreads = Br / TC * WARP;
    const int r = TC * w + lane / 2, half = lane % 2;
    const long long bh = blockIdx.y;
    const int q0 = blockIdx.x * Br, i = q0 + r;
    const Dropout drop = {seed, offset, threshold, inv_keep};

    // Q_i, dO_i, L_i, D_i: once. Q_i serves only S = scale Q K^T: stored does not load it
    if (!STORED) load_tile<T, Dt>(Qs, LDT, Q + bh * Nq * d, q0, Br, Nq, d, tid, nthreads);
    load_tile<T, Dt>(dOs, LDT, dO + bh * Nq * d, q0, Br, Nq, d, tid, nthreads);
    load_vec_tc(Ls, L + bh * Nq, q0, Br, Nq, tid, nthreads);
    load_vec_tc(Ds, D + bh * Nq, q0, Br, Nq, tid, nthreads);
    for (int e = lane; e < TC * Dt; e += WARP) dQs[(TC * w + e / Dt) * LDO + e % Dt] = 0.0f;

    const int Tc = ceil_div(Nk, Bc);  // the same key tiles the forward visits
    int n_tiles = Tc;
    if (causal) {
        const int last_key = min(q0 + Br, Nq) - 1 + Nk - Nq;
        n_tiles = last_key < 0 ? 0 : min(Tc, last_key / Bc + 1);
    }

    for (int t = 0; t < n_tiles; ++t) {
        const int k0 = t * Bc;
        __syncthreads();  // the previous K_j, V_j (stored: S_ij) are read before we overwrite them
        load_tile<T, Dt>(Ks, LDT, K + bh * Nk * d, k0, Bc, Nk, d, tid, nthreads);
        load_tile<T, Dt>(Vs, LDT, V + bh * Nk * d, k0, Bc, Nk, d, tid, nthreads);
        if (STORED) load_scores_tc(Ss, LDS, S + bh * Nq * Nk, q0, k0, Br, Bc, Nq, Nk, causal, tid, nthreads);
        __syncthreads();  // K_j, V_j (and, on the first tile, Q_i, dO_i, L_i, D_i) are loaded

        for (int nb = 0; nb < Bc / TC; ++nb) {  // this warp's strip: S (flash) and dO V^T
            Acc acc;
            if (!STORED) {
                wmma::fill_fragment(acc, 0.0f);
                mma_k<T, wmma::row_major, wmma::col_major>(acc, Qs + TC * w * LDT, LDT,
                                                           Ks + TC * nb * LDT, LDT, Dt / TC);
                wmma::store_matrix_sync(Ss + TC * w * LDS + TC * nb, acc, LDS, wmma::mem_row_major);
            }
            wmma::fill_fragment(acc, 0.0f);
            mma_k<T, wmma::row_major, wmma::col_major>(acc, dOs + TC * w * LDT, LDT,
                                                       Vs + TC * nb * LDT, LDT, Dt / TC);
            wmma::store_matrix_sync(dPs + TC * w * LDS + TC * nb, acc, LDS, wmma::mem_row_major);
        }
        __syncwarp();  // the strip's S and dP are in shared memory; lanes now read whole rows

        for (int c = half; c < Bc; c += 2) {  // the same values as attn_flash_bwd_dkdv_tc
            const int j = k0 + c;
            const float s = STORED ? Ss[r * LDS + c] : scale * Ss[r * LDS + c];
            const float p = tc_visible(i, j, Nq, Nk, causal) ? expf(s - Ls[r]) : 0.0f;  // P_ij
            const float z = p > 0.0f ? dropout_factor(drop, (bh * Nq + i) * Nk + j) : 0.0f;
            dSs[r * LDP + c] = from_float<T>(p * (dPs[r * LDS + c] * z - Ds[r]));  // dS = P (dP - D)
        }
        __syncwarp();  // the strip's dS is complete

        for (int cb = 0; cb < Dt / TC; ++cb) {  // dQ_i += dS K_j
            Acc acc;
            wmma::load_matrix_sync(acc, dQs + TC * w * LDO + TC * cb, LDO, wmma::mem_row_major);
            mma_k<T, wmma::row_major, wmma::row_major>(acc, dSs + TC * w * LDP, LDP, Ks + TC * cb,
                                                       LDT, Bc / TC);
            wmma::store_matrix_sync(dQs + TC * w * LDO + TC * cb, acc, LDO, wmma::mem_row_major);
        }
    }
    __syncwarp();  // the last dQ stores are done before lanes read whole rows

    if (i < Nq)
        for (int c = half; c < d; c += 2)
            dQ[(bh * Nq + i) * d + c] = from_float<T>(scale * dQs[r * LDO + c]);
}
