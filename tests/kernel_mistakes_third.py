"""A third list of learner mistakes, written after the diagnosis was changed on the second list
(tests/kernel_mistakes_fresh.py) and never used to change it: how far those changes carry.

Each row as in kernel_mistakes_fresh.py: (exercise, the solution's text, the learner's, the
status, the output the report leads with, the pattern where the report names the cause's class
else None, the class in words).
"""

MISTAKES = [
    ("flash_forward", "const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;",
     "const float inv_l = 1.0f / l;", "wrong", "O", "nq_gt_nk", "a row that sees no key: 0 * inf"),
    ("flash_backward", "sk += dSs[ii][y] * Qs[ii][col];",
     "sk += dSs[ii][y] * Qs[ii][col] * scale;", "wrong", "dK", "factor", "the scale twice in dK"),
    ("row_softmax", "for (int c = lane; c < C; c += WARP) {",
     "for (int c = lane; c < C - 1; c += WARP) {", "wrong", "y", "row_factor",
     "the last column left out of the sum"),
    ("naive_ds", "for (int j = lane; j < Nk; j += WARP) dS[row + j]",
     "for (int j = lane; j < Nk; j += 16) dS[row + j]", "fault", None, "global_race",
     "two lanes write one element (a stride below the warp)"),
    ("flash_forward", "acc[c] = alpha * acc[c] + pv;", "acc[c] = alpha * (acc[c] + pv);",
     "wrong", "O", "o_only", "the rescale applied to the new tile's term too"),
    ("flash_backward", "if (q0 + ii >= Nq) break;", "if (q0 + ii > Nq) break;",
     "fault", None, "access", "an off-by-one guard on the rows"),
    ("flash_forward", "const bool seen = visible(i, j, Nq, Nk, causal);",
     "const bool seen = visible(j, i, Nk, Nq, causal);", "wrong", "O", "causal",
     "the mask's arguments swapped"),
    ("row_softmax", "for (int offset = WARP / 2; offset > 0; offset /= 2) {",
     "for (int offset = WARP / 2; offset > 0; offset /= 4) {", "wrong", "y", "everywhere",
     "an incomplete merge (rounds 16, 4, 1)"),
]
