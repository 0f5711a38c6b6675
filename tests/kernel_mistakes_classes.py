"""Learner mistakes whose cause has a class of its own, planted in the solved exercise files:
an exp out of fp32's range (no max subtracted), a power of the softmax scale, a reduction
left in lane 0, D from the wrong product, an index swapped inside a tile, the dropout scale
taken as 1/p, a wmma fragment loaded with the wrong leading dimension, an accumulator read
before it is set.

Each row: (exercise, the solution's text, what the learner wrote instead, the status, the
output the report must lead with, the hint key its pattern must map to).
"""

MISTAKES = [
    # ---- no max subtracted: exp overflows on large scores
    ("row_softmax", "const float m_new = fmaxf(m, v);", "const float m_new = 0.0f;", "wrong",
     "y", "no_max"),
    ("naive_softmax", "const float m_new = fmaxf(m, x);", "const float m_new = 0.0f;", "wrong",
     "P", "no_max"),
    # ---- the scale twice
    ("flash_forward", "s[c] = seen ? scale * dot : -INFINITY;",
     "s[c] = seen ? scale * scale * dot : -INFINITY;", "wrong", "O", "scale_power"),
    ("flash_backward", "if (col < d) atomicAdd(&dQ[(bh * Nq + q0 + ii) * d + col], scale * sq);",
     "if (col < d) atomicAdd(&dQ[(bh * Nq + q0 + ii) * d + col], scale * scale * sq);",
     "wrong", "dQ", "factor"),
    # ---- a reduction that leaves the result in lane 0
    ("naive_ds", "    D = group_sum<WARP>(D);\n",
     "    for (int o = WARP / 2; o > 0; o /= 2) D += __shfl_down_sync(FULL_MASK, D, o);\n",
     "wrong", "dS", "lane0"),
    ("row_softmax", "const float m_o = __shfl_xor_sync(FULL_MASK, m, offset);\n"
     "        const float l_o = __shfl_xor_sync(FULL_MASK, l, offset);",
     "const float m_o = __shfl_down_sync(FULL_MASK, m, offset);\n"
     "        const float l_o = __shfl_down_sync(FULL_MASK, l, offset);", "wrong", "y", "lane0"),
    ("flash_forward", "l = alpha * l + group_sum<LANES>(l_tile);",
     "for (int o = LANES / 2; o > 0; o /= 2) l_tile += __shfl_down_sync(FULL_MASK, l_tile, o);"
     "\n        l = alpha * l + l_tile;", "wrong", "O", "lane0"),
    # ---- D from the wrong product
    ("naive_ds", "D += dP[row + j] * P[row + j];", "D += P[row + j] * P[row + j];", "wrong",
     "dS", "wrong_D"),
    ("flash_backward", "dSs[ii][y] = p * (dpd * z - Ds[ii]);",
     "dSs[ii][y] = p * (dpd * z - Ls[ii]);", "wrong", "dQ", "wrong_D"),
    ("dropout_backward", "dSs[ii][y] = p * (dpd * z - Ds[ii]);",
     "dSs[ii][y] = p * (dpd * z - p * dpd * z);", "wrong", "dQ", "wrong_D"),
    # ---- an index swapped inside a tile
    ("flash_backward", "sv += Pds[ii][y] * dOs[ii][col];", "sv += Pds[y][ii] * dOs[ii][col];",
     "wrong", "dV", "index_swap"),
    ("flash_backward", "scale * row_dot<Dt>(Qs[ii], Ks[y]);",
     "scale * row_dot<Dt>(Qs[y], Ks[ii]);", "wrong", "dQ", "index_swap"),
    # ---- the dropout scale as 1/p: (1 - p) / p on dV, while dQ is wrong too
    ("dropout_backward",
     "const float z = p > 0.0f ? dropout_factor(drop, (bh * Nq + i) * Nk + j) : 0.0f;",
     "const float z = p > 0.0f && dropout_factor(drop, (bh * Nq + i) * Nk + j) > 0.0f ? "
     "16777216.0f / drop.threshold : 0.0f;", "wrong", "dV", "dropout_scale"),
    # ---- a wmma fragment loaded with the wrong leading dimension
    ("wmma_tile", "wmma::load_matrix_sync(a, &As[0][0], KT);",
     "wmma::load_matrix_sync(a, &As[0][0], 8);", "wrong", "C", "leading_dim"),
    ("wmma_tile", "wmma::load_matrix_sync(b, &Bs[0][0], T16);",
     "wmma::load_matrix_sync(b, &Bs[0][0], 8);", "wrong", "C", "leading_dim"),
    # ---- an accumulator never set: it reads the check's poison of locals
    ("flash_forward", "float pv = 0.0f;", "float pv;", "wrong", "O", "uninit"),
    ("flash_backward", "float sv = 0.0f, sk = 0.0f;", "float sv, sk = 0.0f;", "wrong", "dV",
     "uninit"),
    ("flash_backward", "float sq = 0.0f;", "float sq;", "wrong", "dQ", "uninit"),
]
