// Exercise flash_forward (lab 04): the FlashAttention forward's online softmax
// One block owns Br query rows and streams the key tiles through shared memory; row
// group r (LANES threads) owns query i = q0 + r. You write what each row does with a
// tile: its scores, the online softmax (m, l), the accumulator, and the end: O and L.
// Fill in the 4 steps marked '>>> YOUR CODE'; everything else is given.
// Check: python -m ckptlab exercise check flash_forward   (--hint 2: a second hint)
// Solution (try first): kernels/attn_flash_fwd.cu, the kernel the labs run.

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
            // >>> YOUR CODE, step 1 of 4: S_ij = scale * q_i . k_j where i sees j, else -inf
            //     S_ij = scale * (q_i . k_j) for this lane's keys jj = lane + c * LANES, j =
            //     k0 + jj: the dot product over the head dim of row r of Qs and row jj of Ks
            //     (columns past d are 0 in both, so summing all Dt of them is right). Query i
            //     sees key j when j is a real key (j < Nk), i a real row (i < Nq) and, causal,
            //     j <= i + Nk - Nq (the mask aligned to the bottom-right corner; common.cuh
            //     has the test, `visible`). A key that i does not see gets S_ij = -inf: it
            //     then adds nothing to the max, the sum or O. Why i < Nq as well: the stored
            //     variant writes S_ij to HBM wherever i sees j. Defines: seen (does i see j),
            //     s[c].
            const bool seen = false;
            s[c] = -INFINITY;
            // <<< end of step 1
            // stored: S_ij to HBM once, from this register; the backward reads it back
            if (STORED && seen) S[(bh * Nq + i) * Nk + j] = s[c];
            m_tile = fmaxf(m_tile, s[c]);
        }
        // >>> YOUR CODE, step 2 of 4: the online softmax: m, alpha, l, and this tile's P
        //     The online softmax of row i over this tile. m_i is the running max of the
        //     row's scores, l_i the running sum of exp(S_ij - m_i). The new max is the
        //     larger of m and this tile's max, which the row's LANES lanes hold in pieces
        //     (m_tile in each: a reduction over the row group, common.cuh has one). alpha
        //     is the factor e^(m_old - m_new) that brings what was summed under the old
        //     max to the new one; each P~_ij = e^(S_ij - m_new) is then at most 1, so no
        //     score overflows exp. l becomes alpha times l plus the tile's sum of P~
        //     (undropped: L must be the true logsumexp). Ps[r][jj] gets what O uses: P~_ij
        //     times the dropout factor Z_ij / (1 - p), which philox.cuh draws from (seed,
        //     offset) (in drop) and the element's index in a contiguous (B, H, Nq, Nk)
        //     array, only where P~_ij > 0 (the backward draws it the same way). Pitfall:
        //     while row i has seen no key, m_new = -inf and -inf - (-inf) is NaN: take 0
        //     in place of the max then, so that alpha and P~ come out 0. Defines: alpha.
        //     Updates: m, l, row r of Ps.
        const float alpha = 1.0f;
        // <<< end of step 2
        __syncwarp();  // row r of Ps was written by its own row group (one warp); now read it

        // >>> YOUR CODE, step 3 of 4: rescale the accumulator and add this tile's P V
        //     O_i's accumulator, not yet normalised: acc_i = alpha acc_i + sum_jj
        //     P_dropped_ij V_jj, for this lane's columns col = lane + c * LANES. alpha
        //     (step 2) brings what was summed under the old max to the new one, as it did
        //     for l; this tile's part is row r of Ps against column col of Vs, over the
        //     tile's Bc keys (keys past Nk have P = 0). Updates: acc[c].
        // <<< end of step 3
    }

    if (i < Nq) {
        // >>> YOUR CODE, step 4 of 4: O_i = acc_i / l_i and L_i = m_i + log l_i
        //     The end of row i: O_i = acc_i / l_i in this lane's real columns (col < d:
        //     the padded ones exist only in shared memory), and L_i = m_i + log l_i, the
        //     row's logsumexp (natural log), written by one lane. L is all the backward
        //     needs to recompute P = exp(S - L). Pitfall: a row that saw no key (causal,
        //     Nq > Nk) has l = 0: its O is 0 and its L is +inf (so that the backward's P
        //     is 0), not 0/0.
        // <<< end of step 4
    }
}
