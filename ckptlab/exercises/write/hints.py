"""Hints for each pattern of error, in two grades: the first asks the question that points at
the cause; the second, asked for with `--hint 2`, names the rule the lines must follow. Neither
gives the code. An exercise's own hints (spec.Exercise.hints, keyed by pattern or by
(output, pattern)) come before these.
"""

from __future__ import annotations

GENERIC = {
    "tail": (
        "It is wrong only when N is not a multiple of the tile. What is in the last tile's "
        "rows or keys past the end of the arrays, and does your step count them?",
        "Past Nq (rows) or Nk (keys) nothing exists: the loads leave zeros there, so a score "
        "must be masked (-inf before the softmax, P = 0 after) and nothing may be stored."),
    "causal": (
        "It is wrong only with the causal mask. Which (i, j) may contribute, and do the hidden "
        "ones stay out of every sum, max and store of your step?",
        "Query i sees key j iff j <= i + Nk - Nq; a hidden score is -inf, so its P is 0: it "
        "adds nothing to m, l, O or any gradient."),
    "nq_lt_nk": (
        "It is wrong only when there are more keys than queries (causal). Where does the "
        "causal diagonal sit then?",
        "The mask is aligned to the bottom-right corner, as in FlashAttention 2: i sees j iff "
        "j <= i + Nk - Nq, not j <= i."),
    "nq_gt_nk": (
        "It is wrong only when some rows see no key at all (Nq > Nk, causal). What is the "
        "softmax of a row with nothing in it?",
        "Such a row has m = -inf and l = 0, and exp(S - m) would be exp(-inf + inf) = NaN: "
        "subtract 0 instead of m, and give the row P = 0, O = 0 and L = +inf."),
    "d_below": (
        "It is wrong only when the head dim d is below the tile's Dt. What do the columns "
        "d..Dt-1 hold, and does any of them reach global memory?",
        "Columns past d are zero in shared memory and exist nowhere else: sum over them if you "
        "like (they add 0), but never store them (col < d)."),
    "dropout": (
        "It is wrong only with dropout. Is every P_ij that reaches O (or a gradient) scaled by "
        "its own Z_ij / (1 - p)?",
        "Every P_ij that reaches O or a gradient is multiplied by its own factor Z_ij / (1 - p), "
        "drawn by philox.cuh from (seed, offset) and the element's index in a contiguous "
        "(B, H, Nq, Nk) array, exactly as the forward draws it; l and L sum the undropped P."),
    "large": (
        "It is wrong only when the scores are large. Does any exp() see a large positive "
        "argument?",
        "Exponentiate S - m with m the running max, so that every argument is <= 0; when m "
        "grows, rescale what was summed under the old max by exp(m_old - m_new)."),
    "masked": (
        "It is wrong only when some entries are -inf (masked). What does your step do while "
        "everything a lane (or a row) has seen so far is -inf?",
        "While the running max is still -inf, exp(x - m) would be exp(-inf + inf) = NaN: skip "
        "the update (l stays 0) until a finite value arrives; a row of only -inf gives 0."),
    "negative": (
        "It is wrong only when every score is strongly negative (far below -100). What is the "
        "running max before the first score arrives, and what does exp give far below it?",
        "The max subtracted must be the row's own: start it at -inf, so that the largest term "
        "is exp(0) = 1; exp of anything below about -104 is 0 in fp32, and a row summing to "
        "0 has no softmax."),
    "stored": (
        "It is right in the flash instantiation and wrong in the stored one (STORED = true), "
        "compiled from the same file. What does your step do there that flash never does?",
        "With STORED the forward also writes every visible S_ij to HBM and the backward reads "
        "S back instead of recomputing it: each row and key stored or read must be in range "
        "(i < Nq, j < Nk) and visible."),
    "deterministic": (
        "It is right with dQ by atomics and wrong with the deterministic dQ (a second kernel, "
        "DETERMINISTIC = true), compiled from the same file. What differs between the two?",
        "With DETERMINISTIC the dK/dV kernel adds nothing to dQ; attn_flash_bwd_dq forms dS "
        "again, row by row, and must agree with the dK/dV kernel's dS."),
    "stored_deterministic": (
        "It is wrong only in the stored method with the deterministic dQ. Which tiles does "
        "that instantiation load, and does your step read one it does not?",
        "There S comes from HBM and dQ from the second kernel, so the dK/dV kernel never loads "
        "K: a step that recomputes S from Ks reads a tile nobody wrote."),
    "tf32": (
        "It is right for the 16-bit types and wrong for tf32, compiled from the same file. "
        "What is different about the tf32 tiles?",
        "tf32 fragments are m16n16k8: there As is 16 x 8 and Bs 8 x 16, so a size or leading "
        "dimension written as 16 for them reads past the tile: take it from the tile's shape."),
    "float16": (
        "It is right for bfloat16 and wrong for float16, compiled from the same file. What in "
        "your step depends on the input type?",
        "Both 16-bit types share the tile shapes (m16n16k16); only the element type differs: "
        "anything typed in your step must follow the template's T, not one type written out."),
    "heads": (
        "Only the first (b, h) is right. Where in each array does head bh begin?",
        "Head bh = blockIdx.y (or .z) starts bh * Nq * d into Q and O, bh * Nk * d into K and V "
        "and bh * Nq * Nk into S and P."),
    "multi_tile": (
        "It is right with one tile and wrong with several. What must carry over from one tile "
        "to the next, and is it combined or overwritten?",
        "A running quantity is accumulated across tiles (+=, or atomicAdd where other blocks add "
        "to it too); one computed against an older max is rescaled before the new tile's terms "
        "are added."),
    "unwritten": (
        "Some elements were never written. Which thread stores each element, and does every "
        "element have one that reaches its store?",
        "Check the store's guard (i < Nq, col < d) and the loop that hands each thread its "
        "elements (columns lane + c * LANES for c < Dt / LANES; keys lane, lane + 32, ...)."),
    "nan": (
        "NaN or inf came out of the arithmetic. Where could a 0/0, an inf - inf, or a read of "
        "shared memory nobody wrote happen?",
        "exp(-inf - (-inf)) is NaN: while a row (or lane) has seen only masked scores, m = -inf "
        "and l = 0; subtract 0 then, divide by l only when l > 0, and make sure every shared "
        "element read was written first (unwritten shared memory reads as NaN here)."),
    "zero": (
        "Every element is 0. Is the result accumulated into what is stored, or stored at all?",
        "Follow the value from the line that computes it to the store: a local that is summed "
        "but never added to the accumulator (or a store of the wrong variable) leaves 0."),
    "factor": (
        "It is off by one constant factor everywhere. Which scale or normalisation is missing, "
        "or applied twice?",
        "Compare the factor with the softmax scale, 1 / l and N: S = scale * Q K^T, P = exp(S - "
        "L), O = P V / l in the forward; dQ = scale * dS K and dK = scale * dS^T Q."),
    "first_tile": (
        "Only the first tile is wrong. What is different about the first pass through the "
        "loop: the initial values?",
        "Start the running max at -inf, the sums and accumulators at 0, and treat the first "
        "rescale (exp(-inf - m)) as 0."),
    "part": (
        "Only part of the output is wrong, as the message says. Which threads own those "
        "elements, and what do they do differently?",
        "Work out, for one wrong element, which block and thread compute it (the grid and the "
        "index arithmetic at the top of the kernel), then follow that thread through your step."),
    "everywhere": (
        "It is wrong everywhere. Compare your step with its equation term by term: what does "
        "each variable hold at this point of the loop?",
        "Check one element by hand: the kernel's printf works on the emulator; print the "
        "quantities of one thread for one tile and compare them with NumPy in float64."),
    "no_scale": (
        "Your output is what attention gives with the softmax scale left out. Where does the "
        "scale enter?",
        "S_ij = scale * (q_i . k_j), before the max and the exponent; in the backward dQ and "
        "dK carry the scale once more (S = scale * Q K^T)."),
    "z_not_in_dp": (
        "The mask reaches dV but not dP. Through which path of O = P_dropped V does the "
        "gradient reaching P see Z?",
        "dP_ij = (dO_i . V_j) * Z_ij / (1 - p): the factor multiplies dO . V inside dS."),
    "z_not_in_dv": (
        "The mask reaches dP but not dV. Which P does dV = P^T dO need?",
        "dV = P_dropped^T dO, the P the forward multiplied V with: P_ij * Z_ij / (1 - p)."),
    "not_merged": (
        "Each lane normalised the row by what it saw alone. What must every lane know before "
        "it writes its part of the row?",
        "The row's max and sum are reductions over all 32 lanes: merge the lanes' (m, l) with "
        "shuffles until each lane holds the row's, then write."),
    "incomplete_merge": (
        "Groups of lanes never met in the merge. Which rounds of the butterfly does your loop "
        "run?",
        "A butterfly over 32 lanes takes five rounds, offsets 16, 8, 4, 2 and 1 (log2 32); "
        "after them every lane has combined with every other."),
    "not_reduced": (
        "Each lane used only its own part of D. What makes D the row's sum and not the lane's?",
        "D_i sums over all keys of the row, which 32 lanes share: the lanes' partial sums are "
        "added across the warp (common.cuh has a reduction), and every lane needs the total "
        "before dS is formed."),
    "no_p_in_d": (
        "D is the sum of dP alone. What exactly does D_i sum?",
        "D_i = sum_j P_ij dP_ij (= rowsum(dO_i * O_i)): each term is a product."),
    "precedence": (
        "D is subtracted after the product. Where do the parentheses go in dS = P (dP - D)?",
        "dS_ij = P_ij * (dP_ij - D_i): D is subtracted from dP, and the difference scaled by P."),
    "no_D": (
        "The gradients are what dS = P dP gives. What does the softmax's backward subtract "
        "from dP?",
        "dS_ij = P_ij (dP_ij - D_i), D_i = sum_j P_ij dP_ij = rowsum(dO_i * O_i), given in Ds."),
    "race": (
        "A thread read shared memory that another thread wrote, with no barrier between. What "
        "must every thread have finished before anyone reads (or overwrites) it?",
        "Put __syncthreads() between the writes and the reads the message names (__syncwarp() "
        "is enough when writer and reader are in the same warp)."),
    "global_race": (
        "Two threads wrote (or wrote and read) the same element of a global array, and "
        "nothing orders them. Which thread should own that element?",
        "Each output element has exactly one thread that stores it; an index that runs past "
        "its row (a padded column past d, a key past Nk) lands on another thread's element. "
        "Where several blocks must add into one element, the add is atomic."),
    "row_factor": (
        "Each row is right up to a factor of its own. Which per-row quantity scales a row "
        "of the softmax?",
        "A softmax row is normalised by its own sum: divide by l_i once (and by nothing else "
        "that varies per row)."),
    "access": (
        "An access ran outside an array. Which index goes past the end, and which guard does "
        "that line need?",
        "Every global index of a tile must be checked: rows i < Nq, keys j < Nk, columns "
        "col < d; the message names the argument and by how much it is out of range."),
    "barrier": (
        "Not every thread reached the same barrier. Is a __syncthreads() inside a branch or a "
        "loop that some threads leave early?",
        "A barrier must be reached by every thread of the block the same number of times: move "
        "it out of the branch, and let threads with nothing to do skip the work, not the "
        "barrier."),
    "warp": (
        "A warp operation was not reached by every lane its mask names. Is a shuffle inside a "
        "branch that some lanes skip?",
        "All 32 lanes (or all lanes of the group) must call the same shuffle; give lanes with "
        "no data a neutral value (-inf for a max, 0 for a sum) instead of skipping the call."),
    "watchdog": (
        "A launch that takes milliseconds ran for seconds and was stopped. Which loop never "
        "ends?",
        "Check each loop's bound and step on the line the message names: a counter that never "
        "reaches its bound (offset /= 2 while offset >= 0; j += 0), or a wait no thread ends."),
    "stack": (
        "A thread ran out of stack. What does your step put in local memory?",
        "A large local array (or a deep recursion) per thread: keep tiles in __shared__ memory "
        "or in a few registers, as the given code does."),
    "fault": (
        "The kernel stopped with a fault. Read the line the message names: what does it do "
        "that a GPU would not allow?",
        "The emulator names the kernel, block, thread and line: reproduce it with the smallest "
        "case that shows it."),
    "uninit": (
        "Some value is read before it is ever set: the check starts every local variable as "
        "a huge negative pattern. Is every accumulator set before its first +=?",
        "Name each running quantity of your step (a partial sum, a running max, a fragment "
        "that accumulates) and find the line that gives it its starting value, before the "
        "loop that adds to it; a sum starts at 0, a max at -inf."),
    "lane0": (
        "Only the elements lane 0 owns are right. After your reduction, which lanes hold the "
        "row's value, and which still hold only their own part?",
        "The row's sum (or max) must reach every lane that uses it: a reduction that shifts "
        "down leaves the total in lane 0 only; one that exchanges (xor), or a broadcast from "
        "lane 0 afterwards, gives it to all."),
    "no_max": (
        "An exp left fp32's range (inf, NaN or 0) where float64 is finite. Which number is "
        "subtracted from each score before its exp?",
        "Every exponent must be a score minus the row's running max, so that it is <= 0: the "
        "largest term is then exp(0) = 1 and the sum can neither overflow nor be all 0; what "
        "was summed under an older max is rescaled."),
    "scale_power": (
        "The result is off by a power of the softmax scale. How many times does the scale "
        "enter between the dot product and this output?",
        "The scale enters once, in the scores S = scale * q . k; in the backward once more, "
        "in dQ and dK. A second multiplication (in S and again in the exponent, or twice in a "
        "gradient) squares it."),
    "dropout_scale": (
        "The result is off by a factor that depends on the dropout rate p. What does a kept "
        "element get multiplied by?",
        "A kept element is scaled by 1 / (probability of keeping it), so that the expectation "
        "is unchanged: the dropout factor already carries that scale, exactly once."),
    "wrong_D": (
        "D is one number per row, but not the right one. Which two quantities does each term "
        "of D multiply?",
        "D_i is a row sum of products: each term pairs the softmax's probability with its "
        "gradient (equivalently the output row with its gradient), summed over the whole row."),
    "race_heads": (
        "Blocks of different heads wrote the same element. Where in the output does the part "
        "of head bh begin?",
        "Each (b, h) owns its own slice of every per-head array, starting at bh times the "
        "elements one head has there: an index without that offset sends every head to the "
        "first head's slice."),
    "ds_only": (
        "dV is right and dQ, dK are wrong. What goes into dQ and dK that does not go into dV?",
        "Both come from dS = P (dP - D) and dV does not: check which two rows your dP's dot "
        "product pairs (a row of dO with a row of V), and that D is the row's D."),
    "o_only": (
        "L is right and O is wrong. What does O need that L does not?",
        "O sums P V over the tiles, rescaled whenever the max grows, and is divided by l once "
        "at the end: check the accumulator's update and the final division."),
    "index_swap": (
        "The result is what the transposed matrix gives. In your indexing, which index is the "
        "row and which the column?",
        "Write next to each shared-memory read which of i (query) and j (key) it runs over: a "
        "gradient of the keys sums over the queries, so it reads the tile by column."),
    "leading_dim": (
        "The tile product comes out of a tile read with another shape. What is the leading "
        "dimension of each shared tile you load or store?",
        "A fragment load or store reads row r of the tile at pointer + r * (its leading "
        "dimension): that is the row length of that tile as declared in shared memory, one "
        "number per tile."),
}

# a case label or an element pattern -> the GENERIC key that explains it
FAMILY = {
    "tail_i": "tail", "tail_j": "tail", "tail_r": "tail", "tail_c": "tail", "tail_m": "tail",
    "tail_n": "tail", "after_first_tile_i": "multi_tile", "after_first_tile_j": "multi_tile",
    "after_first_tile_k": "multi_tile", "one_tile": "multi_tile",
    "first_tile_i": "first_tile", "first_tile_j": "first_tile",
    "top_left": "nq_lt_nk", "no_mask": "causal", "no_dropout": "dropout",
    "merge_missing_1": "incomplete_merge", "merge_missing_16": "incomplete_merge",
    "huge": "large",
}


def family(pattern: str) -> str:
    """The GENERIC key for `pattern`. A case run through another instantiation of the file,
    "variant+case", takes the variant's: its case passed in the default instantiation."""
    if "+" in pattern:
        return family(pattern.split("+", 1)[0])
    if pattern in GENERIC:
        return pattern
    if pattern in FAMILY:
        return FAMILY[pattern]
    for prefix, key in (("wrong_D", "wrong_D"), ("swap_", "index_swap"), ("ld_", "leading_dim"),
                        ("scale_", "scale_power")):
        if pattern.startswith(prefix):
            return key
    if "negative" in pattern:  # a case of very negative scores: exp underflows without a max
        return "no_max"
    if "large" in pattern:
        return "large"
    if pattern.startswith("tail"):
        return "tail"
    if pattern.startswith("part_"):
        return "part"
    return "everywhere"


def hint(exercise_hints: dict, output: str | None, pattern: str, level: int) -> str:
    """The hint of grade `level` (1 or 2) for `pattern` in `output`."""
    for key in ((output, pattern), pattern, (output, family(pattern)), family(pattern)):
        if key in exercise_hints:
            pair = exercise_hints[key]
            break
    else:
        pair = GENERIC[family(pattern)]
    return pair[min(max(level, 1), 2) - 1]
