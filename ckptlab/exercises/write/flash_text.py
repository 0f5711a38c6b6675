"""What the FlashAttention exercises (flash.py) say to the learner: each step's note (what
the step computes and why: the equations, what it defines and updates, the pitfalls in
words, never the line) with the placeholder that keeps the file building, and the hints of
each exercise in two grades (a question; then the quantity and where it goes).
"""

from ckptlab.exercises.write.spec import StepText

FORWARD_STEPS = {
    1: StepText(("S_ij = scale * (q_i . k_j) for this lane's keys jj = lane + c * LANES, j =",
                 "k0 + jj: the dot product over the head dim of row r of Qs and row jj of Ks",
                 "(columns past d are 0 in both, so summing all Dt of them is right). Query i",
                 "sees key j when j is a real key (j < Nk), i a real row (i < Nq) and, causal,",
                 "j <= i + Nk - Nq (the mask aligned to the bottom-right corner; common.cuh",
                 "has the test, `visible`). A key that i does not see gets S_ij = -inf: it",
                 "then adds nothing to the max, the sum or O. Why i < Nq as well: the stored",
                 "variant writes S_ij to HBM wherever i sees j. Defines: seen (does i see j),",
                 "s[c]."),
                ("const bool seen = false;",
                 "s[c] = -INFINITY;")),
    2: StepText(("The online softmax of row i over this tile. m_i is the running max of the",
                 "row's scores, l_i the running sum of exp(S_ij - m_i). The new max is the",
                 "larger of m and this tile's max, which the row's LANES lanes hold in pieces",
                 "(m_tile in each: a reduction over the row group, common.cuh has one). alpha",
                 "is the factor e^(m_old - m_new) that brings what was summed under the old",
                 "max to the new one; each P~_ij = e^(S_ij - m_new) is then at most 1, so no",
                 "score overflows exp. l becomes alpha times l plus the tile's sum of P~",
                 "(undropped: L must be the true logsumexp). Ps[r][jj] gets what O uses: P~_ij",
                 "times the dropout factor Z_ij / (1 - p), which philox.cuh draws from (seed,",
                 "offset) (in drop) and the element's index in a contiguous (B, H, Nq, Nk)",
                 "array, only where P~_ij > 0 (the backward draws it the same way). Pitfall:",
                 "while row i has seen no key, m_new = -inf and -inf - (-inf) is NaN: take 0",
                 "in place of the max then, so that alpha and P~ come out 0. Defines: alpha.",
                 "Updates: m, l, row r of Ps."),
                ("const float alpha = 1.0f;",)),
    3: StepText(("O_i's accumulator, not yet normalised: acc_i = alpha acc_i + sum_jj",
                 "P_dropped_ij V_jj, for this lane's columns col = lane + c * LANES. alpha",
                 "(step 2) brings what was summed under the old max to the new one, as it did",
                 "for l; this tile's part is row r of Ps against column col of Vs, over the",
                 "tile's Bc keys (keys past Nk have P = 0). Updates: acc[c]."),
                ()),
    4: StepText(("The end of row i: O_i = acc_i / l_i in this lane's real columns (col < d:",
                 "the padded ones exist only in shared memory), and L_i = m_i + log l_i, the",
                 "row's logsumexp (natural log), written by one lane. L is all the backward",
                 "needs to recompute P = exp(S - L). Pitfall: a row that saw no key (causal,",
                 "Nq > Nk) has l = 0: its O is 0 and its L is +inf (so that the backward's P",
                 "is 0), not 0/0."),
                ()),
}

FORWARD_HINTS = {
    "multi_tile": (
        "O is right with one key tile and wrong with several. When a later tile raises a "
        "row's max, what happens to what that row summed before?",
        "Steps 2 and 3: l and acc were summed against the old max; under the new max each "
        "must first be multiplied by alpha, the factor from the old max to the new, and only "
        "then take this tile's terms."),
    ("L", "everywhere"): (
        "L is wrong where O may be right. What is L, in terms of the row's max and sum?",
        "Step 4: L_i is the logsumexp of row i's scores: the running max plus the natural log "
        "of the running sum, both as they stand after the last tile."),
    ("L", "factor"): (
        "L is off by a constant factor. Is it the log of the sum, plus the max?",
        "Step 4: the natural log of l, added to m: not log2, and not a product."),
    ("O", "factor"): (
        "O is off by one factor everywhere. Is the accumulator normalised by the row's sum, "
        "and are the scores scaled?",
        "Step 1 multiplies the dot product by the softmax scale; step 4 divides the "
        "accumulator by l, once."),
}

BACKWARD_STEPS = {
    1: StepText(("Recompute S_ij = scale * q_i . k_j from row ii of Qs and row y of Ks, summed",
                 "in the forward's column order (common.cuh's row_dot), so that S_ij is bit",
                 "for bit the forward's, which L was formed from; keep STORED's branch, where",
                 "the tile of the S the forward wrote is staged in Pds. dpd is dO_i . V_j",
                 "(row_dot_split: the same products in shorter partial sums), the dP before",
                 "dropout. P_ij = exp(S_ij - L_i) where i sees j (the forward's mask,",
                 "common.cuh's `visible`), else 0; L_i is in Ls[ii]. exp never sees a positive",
                 "argument, as S_ij <= L_i. Defines: s, dpd, p."),
                ("const float s = STORED ? Pds[ii][y] : 0.0f;",
                 "const float dpd = 0.0f;",
                 "const float p = 0.0f;")),
    2: StepText(("The softmax's backward at this entry. With z = Z_ij / (1 - p) (given above),",
                 "the gradient reaching the undropped P is dP_ij = (dO_i . V_j) z. Two values",
                 "go to shared memory for the sums after the barrier, at this thread's entry",
                 "(ii, y): the dropped P_ij z, which dV needs (O = P_dropped V), into Pds; and",
                 "dS_ij = P_ij (dP_ij - D_i), D_i in Ds[ii], into dSs."),
                ()),
    3: StepText(("dV_j += sum_i P_dropped_ij dO_i and dK_j += sum_i dS_ij Q_i over this tile's",
                 "Br rows, for this thread's columns col = lane + c * LANES: column y of Pds",
                 "(of dSs) against the rows of dOs (of Qs). dv[c] and dk[c] sum over every",
                 "query tile of the loop. The scale of dK is applied once, where dK is stored",
                 "below."),
                ()),
    4: StepText(("dQ_i += scale * sum_j dS_ij K_j over this tile's keys, for the rows of this",
                 "Q tile that this row group takes (ii = y, y + Bc, ...: Br may exceed Bc) and",
                 "that are real (q0 + ii < Nq), in the columns col < d. Every K/V block adds",
                 "its share to the same dQ_i at the same time, so the add must be atomic; dQ",
                 "was zeroed by the preprocess kernel."),
                ()),
    5: StepText(("The deterministic dQ kernel (attn_flash_bwd_dq): one block per Q tile, row",
                 "group r owns query i = q0 + r and, of each K/V tile, the keys jj = lane + c",
                 "* LANES. As in step 1, for this (i, j): S_ij recomputed in the forward's",
                 "column order (STORED: the staged tile in dSs), dpd = dO_i . V_j, and P_ij =",
                 "exp(S_ij - L_i) where i sees j, else 0 (L_i in Ls[r]). The same sums in the",
                 "same order as the dK/dV kernel, so both see the same P. Defines: s, dpd, p."),
                ("const float s = STORED ? dSs[r][jj] : 0.0f;",
                 "const float dpd = 0.0f;",
                 "const float p = 0.0f;")),
    6: StepText(("dS_ij = P_ij (dP_ij - D_i) into row r of dSs at key jj, with dP_ij = (dO_i .",
                 "V_j) z (z given above) and D_i in Ds[r]. Only this row's own row group reads",
                 "it back (step 7), so the warp barrier below is enough."),
                ()),
    7: StepText(("dQ_i += sum_j dS_ij K_j over this K/V tile, for this lane's columns col =",
                 "lane + c * LANES: row r of dSs against column col of Ks. dq[c] keeps the sum",
                 "across the K/V tiles, one register a column; dQ_i is written once at the end",
                 "(the scale applied there), with no atomics, so that it comes out the same,",
                 "bit for bit, on every run."),
                ()),
}

BACKWARD_HINTS = {
    ("dQ", "multi_tile"): (
        "dQ is right when a single K/V block runs and wrong when several do. How do the "
        "contributions of different blocks to the same dQ row combine?",
        "Step 4: every K/V block adds its share of dQ_i into global memory at the same time "
        "as the others: a plain store keeps only one block's share, so the add must be "
        "atomic."),
    ("dK", "multi_tile"): (
        "dK is right with one query tile and wrong with several. Across the loop over query "
        "tiles, is dk accumulated or overwritten?",
        "Step 3: dk[c] and dv[c] sum over every query tile: each tile's sum is added to them, "
        "not put in their place."),
    ("dV", "multi_tile"): (
        "dV is right with one query tile and wrong with several. Across the loop over query "
        "tiles, is dv accumulated or overwritten?",
        "Step 3: dv[c] sums P_dropped^T dO over every query tile: each tile's sum is added to "
        "it."),
    ("dQ", "factor"): (
        "dQ is off by a constant factor. Which factor does S = scale * Q K^T put in front of "
        "dQ?",
        "Step 4: dQ = scale dS K: the softmax scale once, as dK has it where it is stored."),
    ("dV", "everywhere"): (
        "dV is wrong everywhere. Is P recomputed against the right L, and is it P (not dS) "
        "that meets dO?",
        "Steps 1-3: P_ij is exp of the scaled score minus L_i, and dV_j sums the dropped P_ij "
        "times dO_i over the rows i: column y of Pds meets the rows of dOs."),
    ("dK", "everywhere"): (
        "dK is wrong where dV is right. Which of the two tiles in shared memory does dK need, "
        "and which row of it?",
        "Steps 2-3: dS_ij = P_ij (dP_ij - D_i), and dK_j sums dS_ij times Q_i over the rows "
        "i: column y of dSs meets the rows of Qs, not Ks."),
}

DROPOUT_STEPS = {
    1: StepText(("z = Z_ij / (1 - p) for this entry: the factor the forward multiplied P_ij",
                 "by, 0 where it dropped the element and 1 / (1 - p) where it kept it. Nothing",
                 "was stored, so draw it again exactly as the forward did: the same function",
                 "of philox.cuh, the same (seed, offset) (in drop) and the same index, the",
                 "element's position in a contiguous (B, H, Nq, Nk) array. Where P_ij = 0",
                 "(masked) the forward drew nothing: z = 0 there. Defines: z."),
                ("const float z = 1.0f;",)),
    2: StepText(("Where Z enters the gradients. O = P_dropped V, so dV needs the dropped P:",
                 "what goes to Pds for dV is P_ij times z. The gradient reaching the undropped",
                 "P is dP_ij = (dO_i . V_j) z (dpd holds dO_i . V_j), and dS_ij = P_ij (dP_ij",
                 "- D_i) takes that dP. The lines below are the no-dropout version: make them",
                 "right with dropout."),
                ("Pds[ii][y] = p;",
                 "dSs[ii][y] = p * (dpd - Ds[ii]);")),
    3: StepText(("The deterministic dQ kernel forms dS on its own and needs the same mask: z",
                 "for this (i, j), drawn as in step 1, and dS_ij = P_ij (dP_ij - D_i) with",
                 "dP_ij = (dO_i . V_j) z, into row r of dSs (D_i in Ds[r]). The lines below",
                 "are the no-dropout version."),
                ("const float z = 1.0f;",
                 "dSs[r][jj] = p * (dpd - Ds[r]);")),
}

DROPOUT_HINTS = {
    "everywhere": (
        "The gradients are wrong everywhere. Is the mask of the backward the mask the forward "
        "drew: the same function, seed, offset and index?",
        "Step 1: z must be the forward's own draw for this element: the same Philox function, "
        "the same seed and offset, the same element index (the position of (b, h, i, j) in a "
        "contiguous (B, H, Nq, Nk) array); step 2: z multiplies P where dV uses it, and dO . "
        "V where dP is formed."),
    ("dV", "factor"): (
        "dV is off by one factor. Is the kept P scaled by 1 / (1 - p), as the forward's?",
        "The factor philox.cuh returns is already Z / (1 - p): P is multiplied by it once, "
        "and by nothing else."),
}
