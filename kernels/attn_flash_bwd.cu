// attn_flash_bwd.cu: FlashAttention backward. Recomputes P from L, never writes N x N.
//
// Forward (attn_flash_fwd.cu): S = scale * Q K^T; P = softmax(S) = exp(S - L);
//                              O = P_dropped V, P_dropped = P * Z / (1 - p).
// Backward, per (i, j) of a tile, with Z regenerated from (seed, offset):
//   P_ij  = exp(S_ij - L_i)                       recomputed, never stored
//   dV_j += sum_i P_dropped_ij dO_i               from O = P_dropped V
//   dP_ij = (dO_i . V_j) * Z_ij / (1 - p)         from O = P_dropped V and the dropout
//   dS_ij = P_ij (dP_ij - D_i)                    from P = softmax(S)
//   dK_j += scale * sum_i dS_ij Q_i               from S = scale * Q K^T
//   dQ_i += scale * sum_j dS_ij K_j               from S = scale * Q K^T
// with D_i = sum_j P_ij dP_ij = rowsum(dO_i * O_i) (the two are equal, dropout or not).
//
// Kernels:
//   attn_flash_bwd_preprocess   D = rowsum(dO * O); unless deterministic, zeroes dQ, which the
//                               atomics of attn_flash_bwd_dkdv then accumulate into
//   attn_flash_bwd_dkdv         outer loop over K/V tiles (one per block), inner over Q tiles;
//                               dK, dV accumulate in registers; unless DETERMINISTIC it also
//                               adds each tile's dQ contribution to global dQ with atomicAdd (FA2)
//   attn_flash_bwd_dq           the deterministic dQ (Triton's tutorial): one block per Q tile
//                               loops over K/V tiles, recomputing P and dP a second time, and
//                               writes dQ once. No atomics, so bitwise reproducible, at the
//                               cost of recomputing S and dO V^T (4 * Nq * Nk * d more FLOPs).
// Shapes: Q, dQ, O, dO (B, H, Nq, d); K, V, dK, dV (B, H, Nk, d); L, D (B, H, Nq); fp32.
// Template: d (head dim), Br (query rows per tile), Bc (keys per tile), multiples of LANES.
// Causal (bottom-right aligned): i sees j iff j <= i + Nk - Nq; tile pairs with no visible
// entry are skipped (the same pairs the forward visits). A row that sees no key has L = +inf,
// P = 0, D = 0 and gets dQ = 0.
//
// Global bytes per (b, h) (exact formulas in ckptlab/traffic.py): preprocess reads O, dO
// (Nq*d each), writes D (Nq) [and dQ (Nq*d) zeros]. dkdv reads K, V once (Nk*d each), and
// Q, dO (rows*d), L, D (rows) for every visited (Q tile, K/V tile) pair, writes dK, dV (Nk*d
// each) [and rows*d atomicAdds to dQ per visited pair]. dq reads Q, dO (Nq*d), L, D (Nq) once
// and K, V (cols*d) per visited pair, writes dQ (Nq*d).
#include "common.cuh"

// D_i = sum_c dO_ic O_ic, one warp per row of the flattened (B*H*Nq, d) arrays; unless
// deterministic, also dQ_i = 0 (the atomics then add into it). grid (ceil(rows / warps)),
// block (32, warps).
extern "C" __global__ void attn_flash_bwd_preprocess(const float* O, const float* dO, float* D,
                                                     float* dQ, int rows, int d,
                                                     int deterministic) {
    const int lane = threadIdx.x, row = blockIdx.x * blockDim.y + threadIdx.y;
    if (row >= rows) return;  // the whole warp leaves together: no shuffle is skipped
    const long long base = (long long)row * d;
    float acc = 0.0f;
    for (int c = lane; c < d; c += WARP) acc += dO[base + c] * O[base + c];
    acc = group_sum<WARP>(acc);
    if (lane == 0) D[row] = acc;
    if (!deterministic)
        for (int c = lane; c < d; c += WARP) dQ[base + c] = 0.0f;
}

// Loads rows [r0, r0 + R) of a (N, d) matrix into shared memory, zero past N.
template <int d, int R, int STRIDE>
__device__ __forceinline__ void load_rows(float (*dst)[STRIDE], const float* src, int r0, int N,
                                          int tid, int nthreads) {
    for (int e = tid; e < R * d; e += nthreads) {
        const int rr = e / d, c = e % d;
        float x = 0.0f;
        if (r0 + rr < N) x = src[(long long)(r0 + rr) * d + c];
        dst[rr][c] = x;
    }
}

// Loads R entries of a per-row vector (L or D) starting at r0, `fill` past N.
template <int R>
__device__ __forceinline__ void load_vec(float* dst, const float* src, int r0, int N, float fill,
                                         int tid) {
    if (tid < R) dst[tid] = r0 + tid < N ? src[r0 + tid] : fill;
}

// grid (Tc = ceil(Nk/Bc), B*H), block (LANES, Bc): row group y = threadIdx.y owns key
// j = k0 + y: its dK_j, dV_j columns lane + c*LANES, and the S/dP entries (i, j) for the
// tile rows i = lane + rr*LANES.
template <int d, int Br, int Bc, bool DETERMINISTIC>
__global__ void __launch_bounds__(Bc * LANES) attn_flash_bwd_dkdv(const float* Q, const float* K, const float* V,
                                    const float* dO, const float* L, const float* D, float* dQ,
                                    float* dK, float* dV, int Nq, int Nk, float scale, int causal,
                                    unsigned long long seed, unsigned long long offset,
                                    unsigned threshold, float inv_keep) {
    static_assert(d % LANES == 0 && Br % LANES == 0 && Bc % (WARP / LANES) == 0, "tile sizes");
    static_assert(Br <= Bc * LANES, "load_vec needs a thread per query row of the tile");
    __shared__ float Ks[Bc][d + 1];  // +1: lanes reading different rows at one k hit distinct banks
    __shared__ float Vs[Bc][d + 1];
    __shared__ float Qs[Br][d + 1];
    __shared__ float dOs[Br][d + 1];
    __shared__ float Pds[Br][Bc + 1];  // P_dropped of the tile pair, for dV
    __shared__ float dSs[Br][Bc + 1];  // dS of the tile pair, for dK and dQ
    __shared__ float Ls[Br], Ds[Br];

    const int lane = threadIdx.x, y = threadIdx.y;
    const int tid = y * LANES + lane, nthreads = Bc * LANES;
    const long long bh = blockIdx.y;
    const int k0 = blockIdx.x * Bc, j = k0 + y;
    const Dropout drop = {seed, offset, threshold, inv_keep};

    load_rows<d, Bc>(Ks, K + bh * Nk * d, k0, Nk, tid, nthreads);  // K_j, V_j: once per block
    load_rows<d, Bc>(Vs, V + bh * Nk * d, k0, Nk, tid, nthreads);

    // Q tiles that see any key of this tile: all, or (causal) from the first row that sees k0
    const int Tr = ceil_div(Nq, Br);
    int a0 = 0;
    if (causal) {
        const int i0 = k0 - (Nk - Nq);  // first query row that sees key k0
        a0 = i0 > Nq - 1 ? Tr : max(i0, 0) / Br;
    }

    float dk[d / LANES], dv[d / LANES];
    for (int c = 0; c < d / LANES; ++c) dk[c] = dv[c] = 0.0f;

    for (int a = a0; a < Tr; ++a) {
        const int q0 = a * Br;
        __syncthreads();  // the previous Q_i, dO_i, P, dS are read; (first pass: K_j, V_j loaded)
        load_rows<d, Br>(Qs, Q + bh * Nq * d, q0, Nq, tid, nthreads);
        load_rows<d, Br>(dOs, dO + bh * Nq * d, q0, Nq, tid, nthreads);
        load_vec<Br>(Ls, L + bh * Nq, q0, Nq, 0.0f, tid);
        load_vec<Br>(Ds, D + bh * Nq, q0, Nq, 0.0f, tid);
        __syncthreads();  // Q_i, dO_i, L_i, D_i are in shared memory (and K_j, V_j)

        for (int rr = 0; rr < Br / LANES; ++rr) {
            const int ii = lane + rr * LANES, i = q0 + ii;
            float s = 0.0f, dpd = 0.0f;  // S_ij / scale, and (dO V^T)_ij
            for (int k = 0; k < d; ++k) {
                s += Qs[ii][k] * Ks[y][k];
                dpd += dOs[ii][k] * Vs[y][k];
            }
            const bool visible = i < Nq && j < Nk && (!causal || j <= i + Nk - Nq);
            const float p = visible ? expf(scale * s - Ls[ii]) : 0.0f;  // P_ij = exp(S_ij - L_i)
            const float z = p > 0.0f ? dropout_factor(drop, (bh * Nq + i) * Nk + j) : 0.0f;
            Pds[ii][y] = p * z;
            dSs[ii][y] = p * (dpd * z - Ds[ii]);  // dS_ij = P_ij (dP_ij - D_i)
        }
        __syncthreads();  // dK/dV read column y of P and dS (own row group), but dQ reads whole
                          // rows of dS written by every row group

        for (int c = 0; c < d / LANES; ++c) {  // dV_j += P_dropped^T dO,  dK_j += dS^T Q
            const int col = lane + c * LANES;
            float sv = 0.0f, sk = 0.0f;
            for (int ii = 0; ii < Br; ++ii) {
                sv += Pds[ii][y] * dOs[ii][col];
                sk += dSs[ii][y] * Qs[ii][col];
            }
            dv[c] += sv;
            dk[c] += sk;
        }
        if (!DETERMINISTIC) {  // dQ_i += scale * dS_ij K_j, rows ii = y, y + Bc, ... of this Q tile
            for (int ii = y; ii < Br; ii += Bc) {
                if (q0 + ii >= Nq) break;
                for (int c = 0; c < d / LANES; ++c) {
                    const int col = lane + c * LANES;
                    float sq = 0.0f;
                    for (int jj = 0; jj < Bc; ++jj) sq += dSs[ii][jj] * Ks[jj][col];
                    atomicAdd(&dQ[(bh * Nq + q0 + ii) * d + col], scale * sq);
                }
            }
        }
    }

    if (j < Nk) {  // every key row is written, also one no query sees (dK = dV = 0)
        for (int c = 0; c < d / LANES; ++c) {
            const long long e = (bh * Nk + j) * d + lane + c * LANES;
            dK[e] = scale * dk[c];
            dV[e] = dv[c];
        }
    }
}

// Deterministic dQ. grid (Tr = ceil(Nq/Br), B*H), block (LANES, Br): row group r owns query
// i = q0 + r, its dQ columns lane + c*LANES and its S/dP entries j = lane + c*LANES.
template <int d, int Br, int Bc>
__global__ void __launch_bounds__(Br * LANES) attn_flash_bwd_dq(const float* Q, const float* K, const float* V, const float* dO,
                                  const float* L, const float* D, float* dQ, int Nq, int Nk,
                                  float scale, int causal, unsigned long long seed,
                                  unsigned long long offset, unsigned threshold, float inv_keep) {
    static_assert(d % LANES == 0 && Bc % LANES == 0 && Br % (WARP / LANES) == 0, "tile sizes");
    __shared__ float Qs[Br][d + 1];
    __shared__ float dOs[Br][d + 1];
    __shared__ float Ks[Bc][d + 1];
    __shared__ float Vs[Bc][d + 1];
    __shared__ float dSs[Br][Bc + 1];
    __shared__ float Ls[Br], Ds[Br];

    const int lane = threadIdx.x, r = threadIdx.y;
    const int tid = r * LANES + lane, nthreads = Br * LANES;
    const long long bh = blockIdx.y;
    const int q0 = blockIdx.x * Br, i = q0 + r;
    const Dropout drop = {seed, offset, threshold, inv_keep};

    load_rows<d, Br>(Qs, Q + bh * Nq * d, q0, Nq, tid, nthreads);  // Q_i, dO_i, L_i, D_i: once
    load_rows<d, Br>(dOs, dO + bh * Nq * d, q0, Nq, tid, nthreads);
    load_vec<Br>(Ls, L + bh * Nq, q0, Nq, 0.0f, tid);
    load_vec<Br>(Ds, D + bh * Nq, q0, Nq, 0.0f, tid);

    const int Tc = ceil_div(Nk, Bc);  // the same key tiles the forward visits
    int n_tiles = Tc;
    if (causal) {
        const int last_key = min(q0 + Br, Nq) - 1 + Nk - Nq;
        n_tiles = last_key < 0 ? 0 : min(Tc, last_key / Bc + 1);
    }

    float dq[d / LANES];
    for (int c = 0; c < d / LANES; ++c) dq[c] = 0.0f;

    for (int t = 0; t < n_tiles; ++t) {
        const int k0 = t * Bc;
        __syncthreads();  // the previous K_j, V_j, dS are read before we overwrite them
        load_rows<d, Bc>(Ks, K + bh * Nk * d, k0, Nk, tid, nthreads);
        load_rows<d, Bc>(Vs, V + bh * Nk * d, k0, Nk, tid, nthreads);
        __syncthreads();  // K_j, V_j (and, on the first tile, Q_i, dO_i, L_i, D_i) are loaded

        for (int c = 0; c < Bc / LANES; ++c) {
            const int jj = lane + c * LANES, j = k0 + jj;
            float s = 0.0f, dpd = 0.0f;  // the same sums, in the same order, as attn_flash_bwd_dkdv
            for (int k = 0; k < d; ++k) {
                s += Qs[r][k] * Ks[jj][k];
                dpd += dOs[r][k] * Vs[jj][k];
            }
            const bool visible = i < Nq && j < Nk && (!causal || j <= i + Nk - Nq);
            const float p = visible ? expf(scale * s - Ls[r]) : 0.0f;  // P_ij = exp(S_ij - L_i)
            const float z = p > 0.0f ? dropout_factor(drop, (bh * Nq + i) * Nk + j) : 0.0f;
            dSs[r][jj] = p * (dpd * z - Ds[r]);  // dS_ij = P_ij (dP_ij - D_i)
        }
        __syncwarp();  // row r of dS was written by its own row group (one warp); now read it

        for (int c = 0; c < d / LANES; ++c) {  // dQ_i += dS_ij K_j
            const int col = lane + c * LANES;
            float sq = 0.0f;
            for (int jj = 0; jj < Bc; ++jj) sq += dSs[r][jj] * Ks[jj][col];
            dq[c] += sq;
        }
    }

    if (i < Nq)
        for (int c = 0; c < d / LANES; ++c) dQ[(bh * Nq + i) * d + lane + c * LANES] = scale * dq[c];
}
