// Exercise scratch/flash_backward (lab 05): the FlashAttention backward, from the mathematics.
// The kernels' signatures, their launches and their shared memory are given; the bodies of
// attn_flash_bwd_dkdv and attn_flash_bwd_dq are yours (attn_flash_bwd_preprocess is given).
// Check: python -m ckptlab exercise check scratch/flash_backward   (--hint 2: a second hint)
// The same check as the guided labs/exercises/flash_backward.cu (same cases, same diagnosis).
// Solution (try first): kernels/attn_flash_bwd.cu, the kernels the labs run.
//
// ---- What to compute (per head (b, h); fp32, contiguous, row-major) ----------------------
// The forward (kernels/attn_flash_fwd.cu, your scratch/flash_forward.cu) computed
//   S = scale * Q K^T,  P = softmax(S) row by row over the keys a row sees,  O = P_dropped V,
//   L_i = logsumexp_j S_ij  (B, H, Nq),  P_dropped_ij = P_ij * Z_ij / (1 - p),
// and kept only O and L (STORED: also S). Given dO = dLoss/dO (B, H, Nq, d), compute
//   dQ (B, H, Nq, d), dK (B, H, Nk, d), dV (B, H, Nk, d):
//   P_ij   = exp(S_ij - L_i)              where query i sees key j, else 0 (recomputed: P was
//                                         never stored; S_ij = scale * q_i . k_j again)
//   z_ij   = Z_ij / (1 - p)               the forward's dropout factor, drawn again
//   dV_j   = sum_i P_ij z_ij dO_i         dV = P_dropped^T dO
//   dP_ij  = (dO_i . V_j) z_ij            dP = (dO V^T) * z, the gradient reaching P
//   D_i    = sum_c dO_ic O_ic             D = rowsum(dO * O) (= sum_j P_ij dP_ij)
//   dS_ij  = P_ij (dP_ij - D_i)           the softmax's backward
//   dQ_i   = scale * sum_j dS_ij K_j      dQ = scale dS K
//   dK_j   = scale * sum_i dS_ij Q_i      dK = scale dS^T Q
// Mask: query i sees key j iff i < Nq, j < Nk and, when causal != 0, j <= i + Nk - Nq
// (bottom-right aligned; common.cuh's visible()). A row that sees no key has L_i = +inf, so
// P_ij = 0 and D_i = 0 there: its dQ_i = 0. A key no query sees gets dK_j = dV_j = 0, written.
// Nothing Nq x Nk may go to global memory: P and dS live one (query tile, key tile) pair at a
// time in shared memory.
//
// Dropout: z_ij = dropout_factor(drop, index) (philox.cuh), index = ((b*H + h) * Nq + i) * Nk
// + j, with the Dropout {seed, offset, threshold, inv_keep} of the kernel's last four
// arguments: the very Z_ij the forward drew (1 without dropout).
//
// STORED (the store-P method): the forward wrote S_ij for every visible (i, j) to S
// (B, H, Nq, Nk); read it back instead of recomputing Q K^T (load_scores in common.cuh stages
// a tile of it, -inf where i does not see j: the entries the forward never wrote are NaN).
// With STORED = false, S is an empty array: never touch it.
//
// ---- The kernels and their launches (ckptlab/kernels/flash.py) ----------------------------
// 1. attn_flash_bwd_preprocess (given): D = rowsum(dO * O); unless `deterministic`, it also
//    zeroes dQ, which attn_flash_bwd_dkdv then adds into. It is given because it holds no
//    lesson of this lab: its one-warp row sum is lab 01's and lab 03's exercise (row_softmax,
//    naive_ds), and zeroing dQ is the contract the wrapper and the atomic dQ rely on.
// 2. attn_flash_bwd_dkdv<Dt, Br, Bc, DETERMINISTIC, STORED> (yours): grid (ceil(Nk / Bc),
//    B*H), block (LANES, Bc). blockIdx.x is a key tile, keys k0 = blockIdx.x * Bc ...,
//    blockIdx.y is bh = b*H + h; row group y = threadIdx.y (LANES = 8 threads, threadIdx.x =
//    lane) owns key j = k0 + y: dK_j and dV_j stay in its registers (Dt / LANES columns a lane,
//    lane + c*LANES) over a loop over every query tile that sees the key tile, and are stored
//    once at the end. Suggested split of a tile pair's (i, j) entries: row group y forms
//    column y (its key j) for the tile's rows ii = lane + rr*LANES.
//    DETERMINISTIC = false (FlashAttention 2): the kernel also adds each tile pair's part of
//    dQ_i into global dQ with atomicAdd (every key tile adds to the same dQ_i at the same
//    time). DETERMINISTIC = true: it leaves dQ alone; attn_flash_bwd_dq writes it.
// 3. attn_flash_bwd_dq<Dt, Br, Bc, STORED> (yours; launched after dkdv when the backward runs
//    with deterministic=True): grid (ceil(Nq / Br), B*H), block (LANES, Br); row group
//    r = threadIdx.y owns query i = q0 + r (q0 = blockIdx.x * Br) and loops over the key
//    tiles it sees, forming dS again, and writes dQ_i once: no atomics, bitwise reproducible.
// Template: Dt is the tile head dim (16, 32, ..., 256: ckptlab/kernels/table.py), d <= Dt the
// real head dim at run time: shared-memory tiles are Dt wide, their columns d..Dt-1 must hold
// 0, and no column >= d is read from or written to global memory. Br (query rows per tile)
// and Bc (keys per tile) are multiples of 8; Nq and Nk need not be multiples of them.
// Every thread of a block must reach every __syncthreads(), and every lane of a warp every
// group_max / group_sum: a row or key past the end still runs (on zeros) and stores nothing.
//
// ---- Given --------------------------------------------------------------------------------
// common.cuh: ceil_div, group_sum, group_max, visible, load_rows, load_vec, load_scores;
// philox.cuh: Dropout, dropout_factor; below: row_dot (the forward's column order: your S_ij
// then equals the one L was formed from) and row_dot_split (a dot product with a smaller
// rounding error, for dO_i . V_j). The shared memory of each kernel is what the wrappers
// budget for (table.py: flash_bwd_shared_bytes, 48 KiB): use it, and declare no more.
#include "common.cuh"

#define DOT_WAYS 8  // partial sums of row_dot_split

// a . b over the Dt columns of two shared-memory rows, summed in column order
template <int Dt>
__device__ __forceinline__ float row_dot(const float* a, const float* b) {
    float s = 0.0f;
    for (int k = 0; k < Dt; ++k) s += a[k] * b[k];
    return s;
}

// a . b as DOT_WAYS interleaved partial sums added pairwise at the end: the same
// multiply-adds as row_dot, with a rounding error that grows DOT_WAYS times slower with Dt
template <int Dt>
__device__ __forceinline__ float row_dot_split(const float* a, const float* b) {
    static_assert(Dt % DOT_WAYS == 0, "tile head dim: a multiple of DOT_WAYS");
    float part[DOT_WAYS] = {};
    for (int k = 0; k < Dt; k += DOT_WAYS)
        for (int w = 0; w < DOT_WAYS; ++w) part[w] += a[k + w] * b[k + w];
    for (int n = DOT_WAYS / 2; n > 0; n /= 2)
        for (int w = 0; w < n; ++w) part[w] += part[w + n];
    return part[0];
}

// D_i = sum_c dO_ic O_ic, one warp per row of the flattened (B*H*Nq, d) arrays; unless
// deterministic, also dQ_i = 0 (the atomics then add into it). grid (ceil(rows / warps)),
// block (32, warps). Given (see above).
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

template <int Dt, int Br, int Bc, bool DETERMINISTIC, bool STORED>
__global__ void __launch_bounds__(Bc * LANES)
attn_flash_bwd_dkdv(const float* Q, const float* K, const float* V, const float* dO,
                    const float* L, const float* D, const float* S, float* dQ, float* dK,
                    float* dV, int Nq, int Nk, int d, float scale, int causal,
                    unsigned long long seed, unsigned long long offset, unsigned threshold,
                    float inv_keep) {
    static_assert(Dt % LANES == 0 && Dt <= MAX_HEAD_DIM, "tile head dim");
    static_assert(Br % LANES == 0 && Bc % (WARP / LANES) == 0, "tile sizes");
    static_assert(Br <= Bc * LANES, "load_vec needs a thread per query row of the tile");
    __shared__ float Ks[Bc][Dt + 1];   // K_j: this block's key tile
    __shared__ float Vs[Bc][Dt + 1];   // V_j
    __shared__ float Qs[Br][Dt + 1];   // Q_i: the current query tile
    __shared__ float dOs[Br][Dt + 1];  // dO_i
    __shared__ float Pds[Br][Bc + 1];  // the tile pair's P_dropped (STORED: S staged first)
    __shared__ float dSs[Br][Bc + 1];  // the tile pair's dS
    __shared__ float Ls[Br], Ds[Br];   // L_i, D_i of the query tile

    // >>> YOUR CODE, step 1 of 2: the body of attn_flash_bwd_dkdv
    //     K_j and V_j once; for each query tile that sees the key tile: Q_i, dO_i, L_i, D_i
    //     (STORED: S) into shared memory, the tile pair's P and dS, dV_j and dK_j in
    //     registers, and unless DETERMINISTIC the pair's part of dQ_i; at the end dK_j, dV_j.
    // <<< end of step 1
}

template <int Dt, int Br, int Bc, bool STORED>
__global__ void __launch_bounds__(Br * LANES)
attn_flash_bwd_dq(const float* Q, const float* K, const float* V, const float* dO,
                  const float* L, const float* D, const float* S, float* dQ, int Nq, int Nk,
                  int d, float scale, int causal, unsigned long long seed,
                  unsigned long long offset, unsigned threshold, float inv_keep) {
    static_assert(Dt % LANES == 0 && Dt <= MAX_HEAD_DIM, "tile head dim");
    static_assert(Bc % LANES == 0 && Br % (WARP / LANES) == 0, "tile sizes");
    __shared__ float Qs[Br][Dt + 1];   // Q_i: this block's query tile
    __shared__ float dOs[Br][Dt + 1];  // dO_i
    __shared__ float Ks[Bc][Dt + 1];   // K_j: the current key tile
    __shared__ float Vs[Bc][Dt + 1];   // V_j
    __shared__ float dSs[Br][Bc + 1];  // the tile pair's dS (STORED: S staged first)
    __shared__ float Ls[Br], Ds[Br];   // L_i, D_i

    // >>> YOUR CODE, step 2 of 2: the body of attn_flash_bwd_dq
    //     Q_i, dO_i, L_i, D_i once; for each key tile row i sees: K_j, V_j (STORED: S) into
    //     shared memory, the tile pair's dS, dQ_i in registers; at the end dQ_i, once.
    // <<< end of step 2
}
