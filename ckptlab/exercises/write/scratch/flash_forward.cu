// Exercise scratch/flash_forward (lab 04): the FlashAttention forward, from the mathematics.
// The kernel's signature, its launch and its shared memory are given; its body is yours.
// Check: python -m ckptlab exercise check scratch/flash_forward   (--hint 2: a second hint)
// The same check as the guided labs/exercises/flash_forward.cu (same cases, same diagnosis).
// Solution (try first): kernels/attn_flash_fwd.cu, the kernel the labs run.
//
// ---- What to compute (per head (b, h); fp32, contiguous, row-major) ----------------------
//   Q (B, H, Nq, d), K (B, H, Nk, d), V (B, H, Nk, d)  ->  O (B, H, Nq, d), L (B, H, Nq)
//   S = scale * Q K^T                      (Nq x Nk), never written to global memory (but see
//                                          STORED below)
//   P_ij = exp(S_ij) / sum_j' exp(S_ij')   the softmax of row i over the keys j' it sees
//   O = P_dropped V                        (P_dropped: P with dropout, below)
//   L_i = log sum_j exp(S_ij)              the row's logsumexp over the keys it sees; the
//                                          backward recomputes P = exp(S - L) from it
// The causal mask is aligned to the bottom-right corner (FlashAttention 2): query i sees key j
// iff i < Nq, j < Nk and, when causal != 0, j <= i + Nk - Nq (common.cuh's visible()). With
// Nq > Nk some rows see no key: their O_i = 0 and L_i = +inf (so that exp(S - L) = 0 later).
//
// Nothing Nq x Nk may go to global memory: S and P live one key tile at a time on chip. The
// online softmax keeps, per row i, a running max m, a running sum l and an unnormalised
// accumulator acc (d values), starting from m = -inf, l = 0, acc = 0. For each key tile
// (keys j in [k0, k0 + Bc)):
//   m_new = max(m, max_j S_ij)
//   alpha = exp(m - m_new)                        rescales what was summed under the old max
//   l     = alpha * l + sum_j exp(S_ij - m_new)
//   acc   = alpha * acc + sum_j exp(S_ij - m_new) * Z_ij / (1 - p) * V_j
//   m     = m_new
// and after the last tile O_i = acc / l, L_i = m + log l. Every exponent is <= 0, so scores
// of |S| ~ 1e4 cannot overflow; a key that row i does not see has S_ij = -inf (exp gives 0).
// While row i has seen no visible key, m_new is still -inf, and exp(-inf - (-inf)) is NaN:
// your recurrence must give alpha and the tile's terms without NaN there. With the causal
// mask, a key tile that no row of the block sees need not be visited at all (the lab's byte
// model, which the check prints once you are right, skips those tiles).
//
// Dropout (p >= 0): P_dropped_ij = P_ij * Z_ij / (1 - p), Z_ij in {0, 1} drawn by Philox from
// (seed, offset) at the element's index ((b*H + h) * Nq + i) * Nk + j, its position in a
// contiguous (B, H, Nq, Nk) array. dropout_factor(drop, index) (philox.cuh) returns
// Z_ij / (1 - p) (1 when dropout is off) for the Dropout {seed, offset, threshold, inv_keep}
// made from the kernel's last four arguments. l and L sum the undropped P: L is the softmax's
// logsumexp with or without dropout. The backward draws the same Z_ij again.
//
// STORED (the store-P method, the same kernel with the template switch on): also write each
// visible S_ij (the scaled score, not P) to S[((b*H + h) * Nq + i) * Nk + j], once; entries
// no query sees are never written. With STORED = false, S is an empty array: never touch it.
//
// ---- Launch (ckptlab/kernels/flash.py) ----------------------------------------------------
// grid (ceil(Nq / Br), B*H), block (LANES, Br): blockIdx.x is the query tile, rows
// q0 = blockIdx.x * Br ..., blockIdx.y is bh = b*H + h. Threads come in row groups of LANES
// (common.cuh: 8) consecutive threads, threadIdx.x = lane, threadIdx.y = r: row group r owns
// query row i = q0 + r. A row group lives inside one warp: group_max<LANES> / group_sum<LANES>
// reduce over it, and a row of shared memory it alone writes and reads needs only
// __syncwarp(). Suggested split of a row's work: lane owns the tile's keys jj = lane + c*LANES
// and the accumulator's columns lane + c*LANES (Dt / LANES registers each).
// Template: Dt is the tile head dim (16, 32, ..., 256: ckptlab/kernels/table.py), d <= Dt the
// real head dim at run time: shared-memory tiles are Dt wide, their columns d..Dt-1 must hold
// 0, and no column >= d is read from or written to global memory. Br (query rows per block)
// and Bc (keys per tile) are multiples of 8; Nq and Nk need not be multiples of them.
// Every thread of the block must reach every __syncthreads(), and every lane of a warp every
// group_max / group_sum: a row past Nq still runs the loop (on zeros) and stores nothing.
//
// ---- Given --------------------------------------------------------------------------------
// common.cuh: ceil_div, group_max, group_sum, visible, load_rows (a tile of rows into shared
// memory, zero-padded), load_vec; philox.cuh: Dropout, dropout_factor. The shared memory below
// is what the wrappers budget for (table.py: flash_fwd_shared_bytes, 48 KiB): use it, and
// declare no more. The +1 in a row's length keeps lanes that read different rows at one
// column on different banks.
#include "common.cuh"

template <int Dt, int Br, int Bc, bool STORED>
__global__ void __launch_bounds__(Br * LANES)
attn_flash_fwd(const float* Q, const float* K, const float* V, float* O, float* L, float* S,
               int Nq, int Nk, int d, float scale, int causal, unsigned long long seed,
               unsigned long long offset, unsigned threshold, float inv_keep) {
    static_assert(Dt % LANES == 0 && Dt <= MAX_HEAD_DIM, "tile head dim");
    static_assert(Bc % LANES == 0 && Br % (WARP / LANES) == 0, "tile sizes");
    __shared__ float Qs[Br][Dt + 1];  // Q_i: the block's Br query rows
    __shared__ float Ks[Bc][Dt + 1];  // K_j: the current key tile
    __shared__ float Vs[Bc][Dt];      // V_j: the current value tile
    __shared__ float Ps[Br][Bc + 1];  // this tile's P_dropped, one row per row group

    // >>> YOUR CODE, step 1 of 1: the body of attn_flash_fwd
    //     Q_i once; then for each key tile: K_j and V_j into shared memory, S_ij, the online
    //     softmax's update, acc; at the end O_i and L_i (and, STORED, S_ij as you go).
    // <<< end of step 1
}
