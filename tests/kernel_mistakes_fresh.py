"""A second list of learner mistakes, written after the diagnosis was built on
tests/kernel_mistakes_classes.py and never used to build it: other steps, other slips.

Each row: (exercise, the solution's text, what the learner wrote instead, the status the check
gives, the output it leads with, the pattern (hint key) the check gives where the report names the
cause's class (in its sentence or in the hint that pattern gets), else None, and the class the
mistake belongs to, in words).
"""

MISTAKES = [
    ("naive_softmax", "p[j] = expf(s[j] - m_ref) * inv_l;", "p[j] = expf(s[j] - m_ref) / l;",
     "wrong", "P", "nq_gt_nk", "a row that sees no key: 0 / 0"),
    ("naive_softmax", "float* p = P + row * Nk;", "float* p = P + (long long)i * Nk;",
     "fault", None, "race_heads", "the head's offset left out"),
    ("flash_forward", "if (lane == 0) L[bh * Nq + i] =", "if (lane == 0) L[i] =",
     "fault", None, "race_heads", "the head's offset left out"),
    ("flash_forward", "dropout_factor(drop, (bh * Nq + i) * Nk + j) : 0.0f;\n            Ps[r][jj]",
     "dropout_factor(drop, (bh * Nq + i) * Nk + jj) : 0.0f;\n            Ps[r][jj]",
     "wrong", "O", "dropout", "the dropout mask's index"),
    ("flash_forward", "const float alpha = expf(m - m_ref);",
     "const float alpha = expf(m_ref - m);",
     "wrong", "O", "nan", "the rescale across tiles"),
    ("flash_forward", "float l_tile = 0.0f;", "float l_tile;", "wrong", "O", "uninit",
     "an accumulator never set"),
    ("flash_forward", "Ps[r][jj] = p * z;", "Ps[r][jj] = p;", "wrong", "O", "dropout",
     "dropout never applied"),
    ("flash_backward", "expf(s - Ls[ii])", "expf(s) / expf(Ls[ii])", "wrong", "dQ", "no_max",
     "exp overflows without the max (L) subtracted first"),
    ("flash_backward", "row_dot_split<Dt>(dOs[ii], Vs[y])", "row_dot_split<Dt>(dOs[ii], Ks[y])",
     "wrong", "dQ", "ds_only", "dP from the wrong tile (K for V)"),
    ("dropout_backward", "dropout_factor(drop, (bh * Nq + i) * Nk + j)",
     "dropout_factor(drop, (bh * Nq + i) * Nk + j + 1)", "wrong", "dQ", "everywhere",
     "the dropout mask's index"),
    ("naive_ds", "for (int j = lane; j < Nk; j += WARP) D += dP[row + j] * P[row + j];",
     "for (int j = lane; j < Nk; j++) D += dP[row + j] * P[row + j];", "wrong", "dS", "wrong_D",
     "D summed wrong (keys counted several times)"),
    ("naive_ds", "dS[row + j] = P[row + j] * (dP[row + j] - D);",
     "dS[row + j] = P[row + j] * (D - dP[row + j]);", "wrong", "dS", "factor", "the sign"),
    ("wmma_tile", "wmma::mma_sync(acc, a, b, acc);", "wmma::mma_sync(acc, b, a, acc);",
     "does not build", None, None, "the operands swapped (B A for A B)"),
    ("wmma_tile", "wmma::store_matrix_sync(&Cs[0][0], acc, T16, wmma::mem_row_major);",
     "wmma::store_matrix_sync(&Cs[0][0], acc, 8, wmma::mem_row_major);", "fault", None, "race",
     "a leading dimension (the store)"),
    ("row_softmax", "if (m_new > -INFINITY) l = l * __expf(m - m_new) + __expf(v - m_new);",
     "if (m_new > -INFINITY) l = l * __expf(m_new - m) + __expf(v - m_new);", "wrong", "y", "zero",
     "the rescale across columns"),
    ("row_softmax", "l = (m == -INFINITY ? 0.0f : l * __expf(m - m_new)) +",
     "l = (m == -INFINITY ? 0.0f : l) +", "wrong", "y", "everywhere",
     "the merge: a lane's own l not rescaled"),
]
