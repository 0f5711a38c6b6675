"""The checkers of the exercises in labs/*.ipynb, one function per exercise, named for it.

Each takes the learner's answer (a number, or a function to fill in) and returns a Verdict: the
string "right", "wrong, because ..." or "not answered yet" (for None or the `...` placeholder).
A checker never raises on an answer: a bad type or a function that raises is a "wrong" with the
reason. The expected values come from ckptlab itself (the traffic models, the roofline, the
float64 reference), never typed in, so an exercise follows the kernels if they change.

    from ckptlab import exercises as check
    check.sgemm_bytes(my_answer, M=40, N=24, K=56)      # -> right
"""

from __future__ import annotations

import math

import numpy as np

from ckptlab import at_scale, attention, reference, rng, roofline, schedules, traffic
from ckptlab.plots import fit_loglog_slope

NOT_YET = "not answered yet"


class Verdict(str):
    """A checker's answer; displays bare in a notebook (right, not 'right')."""

    def __repr__(self) -> str:
        return str(self)


def _right() -> Verdict:
    return Verdict("right")


def _wrong(why: str) -> Verdict:
    return Verdict("wrong, because " + why)


def _unanswered(x) -> bool:
    return x is None or x is Ellipsis


def _number(answer, what: str):
    """(float, None) for a finite real number, else (None, a wrong Verdict saying why)."""
    if isinstance(answer, (bool, np.bool_)) or not isinstance(
            answer, (int, float, np.integer, np.floating)):
        return None, _wrong(f"{what} is a number; you gave {type(answer).__name__} {answer!r}")
    if not math.isfinite(float(answer)):
        return None, _wrong(f"{what} is a finite number; you gave {answer!r}")
    return float(answer), None


def _exact(answer, want: int, what: str, hints=(), hint: str = "") -> Verdict:
    """A count (bytes, FLOPs, a tile size): right iff equal. `hints` are (value, reason) pairs
    for the usual slips; otherwise the reason says how far off the answer is, and `hint`."""
    if _unanswered(answer):
        return Verdict(NOT_YET)
    got, bad = _number(answer, what)
    if bad:
        return bad
    if got == want:
        return _right()
    for value, reason in hints:
        if got == value:
            return _wrong(reason)
    off = f"{got / want:.3g}x" if want else "not 0"
    return _wrong(f"{what} is exact and yours is {off} the count; {hint}".rstrip("; "))


def _close(answer, want: float, what: str, rtol: float, hints=(), hint: str = "") -> Verdict:
    """A ratio or an intensity: right iff within rtol (relative) of want."""
    if _unanswered(answer):
        return Verdict(NOT_YET)
    got, bad = _number(answer, what)
    if bad:
        return bad
    if abs(got - want) <= rtol * abs(want):
        return _right()
    for value, reason in hints:
        if abs(got - value) <= rtol * abs(value):
            return _wrong(reason)
    return _wrong(f"{what} is off by {abs(got / want - 1):.0%} (within {rtol:.0%} counts as "
                  f"right); {hint}".rstrip("; "))


def _call(fn, *args):
    """(result, None), or (None, Verdict) when fn is unanswered, not callable or raises."""
    if _unanswered(fn):
        return None, Verdict(NOT_YET)
    if not callable(fn):
        return None, _wrong(f"the answer is a function; you gave {type(fn).__name__}")
    try:
        out = fn(*args)
    except Exception as e:  # the learner's code: any failure is a reason, not a crash
        return None, _wrong(f"your function raised {type(e).__name__}: {e}")
    if _unanswered(out):
        return None, Verdict(NOT_YET)
    return out, None


def _array(x, shape, what: str):
    """(float64 array, None) if x converts and has `shape`, else (None, a wrong Verdict)."""
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as e:
        return None, _wrong(f"{what} must be an array of numbers ({e})")
    if a.shape != tuple(shape):
        return None, _wrong(f"{what} must have shape {tuple(shape)}, got {a.shape}")
    return a, None


def _rel(x, y) -> float:
    """||x - y|| / ||y||, the relative Frobenius error."""
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))


# ---- lab 01: the roofline -------------------------------------------------------------------
def sgemm_bytes(answer, M: int, N: int, K: int) -> Verdict:
    """Global bytes (read + written) of kernels/sgemm_tiled.cu computing C (M, N) = A (M, K)
    B (K, N), fp32, 16 x 16 tiles."""
    t = traffic.sgemm_tiled(M, N, K)
    once = traffic.BYTES * (M * K + K * N + M * N)
    return _exact(answer, t.bytes, "the byte count", hints=[
        (once, "that counts A, B and C once each: the tiled kernel loads a tile of A again for "
               "every column tile of C (ceil(N/16) times) and of B for every row tile"),
        (t.bytes_read, "that is the reads alone: C is written too"),
        (t.bytes / traffic.BYTES, "that counts elements: an fp32 element is 4 bytes"),
    ], hint=f"A is read ceil(N/{traffic.SGEMM_TILE}) times, B ceil(M/{traffic.SGEMM_TILE}) "
            "times, C written once")


def softmax_intensity(answer, R: int, C: int) -> Verdict:
    """Arithmetic intensity (FLOP per byte of global traffic) of kernels/softmax_rows.cu on an
    (R, C) input, with the FLOPs traffic.softmax_rows counts (5 per element)."""
    t = traffic.softmax_rows(R, C)
    once = t.flops / (traffic.BYTES * 2 * R * C)
    return _close(answer, t.flops / t.bytes, "the intensity", 0.01, hints=[
        (once, "the kernel reads x twice (the online max/sum pass, then the output pass)"),
        (t.flops / (t.bytes / traffic.BYTES), "that divides by elements, not bytes"),
    ], hint="intensity = FLOPs / (bytes read + bytes written)")


def compute_bound_tile(answer, device: str = "A100", size: int = 4096) -> Verdict:
    """The smallest tile T at which sgemm_tiled (M = N = K = size) reaches the ridge point of
    `device` in fp32, i.e. stops being memory-bound on the roofline."""
    ridge = roofline.ridge_point(device, "fp32")

    def intensity(T):
        t = traffic.sgemm_tiled(size, size, size, tile=T)
        return t.flops / t.bytes

    want = next(T for T in range(1, size + 1) if intensity(T) >= ridge)
    if _unanswered(answer):
        return Verdict(NOT_YET)
    got, bad = _number(answer, "the tile size")
    if bad:
        return bad
    if got != int(got) or got < 1:
        return _wrong(f"a tile size is a positive whole number; you gave {answer!r}")
    if got == want:
        return _right()
    name = roofline.spec(device)["name"]
    got_i = intensity(int(got))
    if got_i < ridge:
        return _wrong(f"at T={int(got)} the kernel does {got_i:.3g} FLOP/byte, below the ridge "
                      f"of the {name} ({ridge:.3g} FLOP/byte): it is still memory-bound")
    return _wrong(f"T={int(got)} is compute-bound ({got_i:.3g} FLOP/byte) but a smaller tile "
                  "is too: the question asks for the smallest")


def free_flops(answer, R: int, C: int, device: str = "H100") -> Verdict:
    """How many times its FLOPs softmax_rows could execute at the same modeled time on
    `device` (fp32), before the compute roof, not memory, bounds it: ridge / intensity."""
    t = traffic.softmax_rows(R, C)
    want = roofline.ridge_point(device, "fp32") / (t.flops / t.bytes)
    return _close(answer, want, "the factor", 0.02, hint="the time stays bytes / bandwidth until "
                  "FLOPs / peak catches up: the factor is the ridge point over the intensity")


# ---- lab 02: naive attention ----------------------------------------------------------------
def _nn_traffic(launches, names=("S", "P")) -> int:
    return sum(x.read.get(n, 0) + x.write.get(n, 0) for x in launches for n in names)


def naive_nn_bytes(answer, B: int, H: int, N: int, d: int) -> Verdict:
    """HBM bytes read from and written to S and P (the N x N matrices) by the three launches of
    the naive forward, for q, k, v of shape (B, H, N, d)."""
    want = _nn_traffic(traffic.naive_forward(B, H, N, N, d))
    nn = traffic.BYTES * B * H * N * N
    return _exact(answer, want, "the byte count", hints=[
        (2 * nn, "that is S and P written once each: they are also read back"),
        (4 * nn, "S is written once and read twice and P written once, but P V reads P once for "
                 f"every {attention.NAIVE_TILE}-wide column tile of O: ceil(d/16) times"),
        (want / traffic.BYTES, "that counts elements: fp32 is 4 bytes each"),
    ], hint="count per matrix: S written by the scores kernel, read by both softmax passes; P "
            "written by the softmax, read by P V once per column tile of O")


def naive_saved_bytes(answer, B: int = 64, H: int = 16, N: int = 1024, d: int = 64) -> Verdict:
    """Bytes the naive forward keeps for its backward (P) at (B, H, N, d): by default GPT-2
    medium's attention in the FlashAttention paper's Fig. 2."""
    want = traffic.naive_forward(B, H, N, N, d)[1].write["P"]  # the softmax writes all of P
    return _exact(answer, want, "the byte count", hints=[
        (2 * want, "S is a temporary: only P is kept for the backward"),
        (want / traffic.BYTES, "that counts elements: fp32 is 4 bytes each"),
    ], hint="P has shape (B, H, N, N)")


def traffic_exponent(answer, d: int = 64) -> Verdict:
    """The exponent p in: the naive forward + backward's HBM bytes grow as N^p at large N and
    fixed d (as a whole number)."""
    ns = [2**13, 2**14]
    tot = [traffic.totals(traffic.naive_forward(1, 1, n, n, d)
                          + traffic.naive_backward(1, 1, n, n, d))["bytes"] for n in ns]
    want = round(fit_loglog_slope(ns, tot))
    return _exact(answer, want, "the exponent", hints=[
        (1, "1 would mean only N x d arrays move; S, P, dP and dS are N x N"),
    ], hint="what shape do S and P have?")


# ---- lab 03: the store-P backward -----------------------------------------------------------
def softmax_backward(fn) -> Verdict:
    """fn(P, dP) -> dS for one head: P = softmax(S) row-wise and dP = dL/dP, both (Nq, Nk)
    NumPy arrays; dS = dL/dS. Checked through dQ = scale dS K against reference.backward."""
    g = np.random.default_rng(6)
    Nq, Nk, d = 7, 9, 4
    q, k, v, dO = (g.standard_normal((1, 1, n, d)) for n in (Nq, Nk, Nk, Nq))
    P, _ = reference.probabilities(q, k)  # (1, 1, Nq, Nk)
    dP = dO @ np.swapaxes(v, -1, -2)  # (1, 1, Nq, Nk): dP = dO V^T
    dQ, _, _ = reference.backward(dO, q, k, v)
    out, bad = _call(fn, P[0, 0].copy(), dP[0, 0].copy())
    if bad:
        return bad
    dS, bad = _array(out, (Nq, Nk), "dS")
    if bad:
        return bad
    # float64 all through: only a wrong formula misses by more than 1e-10
    if _rel(reference.default_scale(d) * dS @ k[0, 0], dQ[0, 0]) <= 1e-10:
        return _right()
    P2, dP2 = P[0, 0], dP[0, 0]
    if np.allclose(dS, P2 * dP2):
        return _wrong("each row of dS must sum to 0 (adding a constant to a row of S leaves P "
                      "unchanged): subtract D_i = sum_j P_ij dP_ij from dP before multiplying")
    D = (P2 * dP2).sum(axis=1, keepdims=True)
    if np.allclose(dS, dP2 - D):
        return _wrong("the softmax's Jacobian carries a factor P_ij: dS = P * (dP - D)")
    return _wrong("dQ = scale dS K built from your dS does not match the float64 reference; "
                  "differentiate P_ij = exp(S_ij) / sum_k exp(S_ik) with respect to S_ij")


def store_p_reads(answer, B: int, H: int, N: int, d: int) -> Verdict:
    """HBM bytes the store-P backward (five launches) reads from the saved P, for q, k, v of
    shape (B, H, N, d)."""
    launches = traffic.naive_backward(B, H, N, N, d)
    want = sum(x.read.get("P", 0) for x in launches)
    nn = traffic.BYTES * B * H * N * N
    return _exact(answer, want, "the byte count", hints=[
        (nn, "P is read by two kernels, and more than once by each"),
        (3 * nn, "dV = P^T dO reads P once for every 16-wide column tile of dV (ceil(d/16) "
                 "times), and dS reads it twice (one pass for D, one for dS)"),
        (want / traffic.BYTES, "that counts elements: fp32 is 4 bytes each"),
    ], hint="which launches take P? attn_naive_bwd_dv (a tiled matmul) and attn_naive_bwd_ds "
            "(two passes)")


# ---- lab 04: the flash forward --------------------------------------------------------------
def online_merge(fn) -> Verdict:
    """fn(m_a, l_a, m_b, l_b) -> (m, l): merge two partial softmax states of the same rows
    (m: running max, l: sum of exp(x - m) over the part seen; an empty part has m = -inf,
    l = 0) into the state of both parts. Arrays of shape (rows,)."""
    g = np.random.default_rng(4)
    x = g.standard_normal((5, 12)) * 3
    x[1] += 800.0  # rows whose exp would overflow unless the exponents stay <= 0
    x[2, 6:] -= 900.0
    # the truth: L = logsumexp of each row, from the reference with S = 1 * x I^T = x
    _, L = reference.probabilities(x[None, None], np.eye(12)[None, None], scale=1.0)
    for cut in (0, 3, 6, 11):
        a, b = x[:, :cut], x[:, cut:]
        m_a = a.max(axis=1) if cut else np.full(5, -np.inf)
        l_a = np.exp(a - m_a[:, None]).sum(axis=1) if cut else np.zeros(5)
        m_b = b.max(axis=1)
        l_b = np.exp(b - m_b[:, None]).sum(axis=1)
        out, bad = _call(fn, m_a.copy(), l_a.copy(), m_b.copy(), l_b.copy())
        if bad:
            return bad
        if not (isinstance(out, tuple) and len(out) == 2):
            return _wrong(f"the function returns a pair (m, l); it returned {type(out).__name__}")
        (m, bad), (l, bad2) = _array(out[0], (5,), "m"), _array(out[1], (5,), "l")
        if bad or bad2:
            return bad or bad2
        with np.errstate(all="ignore"):
            got = m + np.log(l)
        if not np.all(np.isfinite(got)):
            return _wrong(f"m + log l is not finite (split at column {cut}): rescale by "
                          "exp(m_a - m) and exp(m_b - m) with m = max(m_a, m_b), so no exponent "
                          "is positive and an empty part (m = -inf, l = 0) adds 0")
        if np.abs(got - L[0, 0]).max() > 1e-12 * np.abs(L[0, 0]).max():  # float64 rounding
            if np.allclose(l, l_a + l_b):
                return _wrong("l_a and l_b were summed under different maxima: rescale each "
                              "by exp(m_part - m) before adding")
            return _wrong(f"m + log l differs from the row's logsumexp (split at column {cut})")
        if not np.array_equal(m, np.maximum(m_a, m_b)):
            return _wrong("m + log l is right but m is not the row max: keep m = max(m_a, m_b) "
                          "so the next tile's exponents stay <= 0")
    return _right()


def flash_tile_rows(answer, d: int = 128, Bc: int = 16) -> Verdict:
    """The largest Br (query rows per tile; a multiple of 8, the lanes per row) for which
    attn_flash_fwd<d, Br, Bc> fits the 48 KiB of static shared memory."""
    fits = [Br for Br in range(attention.LANES, attention.MAX_TILE + 1, attention.LANES)
            if attention.flash_fwd_shared_bytes(d, Br, Bc) <= attention.SHARED_LIMIT]
    want = max(fits)
    if _unanswered(answer):
        return Verdict(NOT_YET)
    got, bad = _number(answer, "Br")
    if bad:
        return bad
    if got == want:
        return _right()
    if got != int(got) or got < attention.LANES or int(got) % attention.LANES:
        return _wrong(f"Br must be a positive multiple of {attention.LANES} (each query row "
                      f"has {attention.LANES} lanes); you gave {answer!r}")
    need = attention.flash_fwd_shared_bytes(d, int(got), Bc)
    if need > attention.SHARED_LIMIT:
        return _wrong(f"Br={int(got)} needs {need:,} bytes of shared memory at d={d}, Bc={Bc}: "
                      f"over the {attention.SHARED_LIMIT:,}-byte limit")
    return _wrong(f"Br={int(got)} fits ({need:,} bytes) but a larger multiple of "
                  f"{attention.LANES} fits too")


def flash_saved_bytes(answer, B: int, H: int, N: int, d: int) -> Verdict:
    """Bytes the flash forward keeps for its backward, for q, k, v of shape (B, H, N, d)."""
    (fwd,) = traffic.flash_forward(B, H, N, N, d)
    want = fwd.bytes_written  # it writes exactly what it keeps: O and L
    return _exact(answer, want, "the byte count", hints=[
        (fwd.write["O"], "O alone is not enough: the backward needs L = m + log l (one fp32 "
                         "per query row) to recompute P = exp(S - L)"),
        (want + traffic.BYTES * B * H * N * N, "nothing N x N is kept: P is recomputed"),
        (want / traffic.BYTES, "that counts elements: fp32 is 4 bytes each"),
    ], hint="O has shape (B, H, N, d) and L shape (B, H, N)")


# ---- lab 05: the recompute backward ---------------------------------------------------------
def _flash_fwd_bwd(B, H, N, d, deterministic=False) -> dict:
    return traffic.totals(traffic.flash_forward(B, H, N, N, d)
                          + traffic.flash_backward(B, H, N, N, d, deterministic=deterministic))


def recompute_flops(answer, B: int, H: int, N: int, d: int) -> Verdict:
    """FLOPs the flash backward (atomic dQ, not causal) spends recomputing S = scale Q K^T, for
    q, k, v of shape (B, H, N, d); matmul FLOPs, 2 per multiply-add."""
    (_, dkdv) = traffic.flash_backward(B, H, N, N, d)
    want = dkdv.recompute_flops
    return _exact(answer, want, "the FLOP count", hints=[
        (want / 2, "a multiply-add is 2 FLOPs"),
        (2 * want, "only S = Q K^T is recomputed (P = exp(S - L) is pointwise); O = P V is not"),
    ], hint="S has N x N entries per (b, h), each a length-d dot product")


def hfu_over_mfu(answer, B: int = 64, H: int = 16, N: int = 1024, d: int = 64) -> Verdict:
    """HFU / MFU of flash attention's forward + backward (atomic dQ, not causal): hardware
    FLOPs (recompute included) over model FLOPs (useful work), at the same time."""
    hw = _flash_fwd_bwd(B, H, N, d)["flops"]
    model = (traffic.model_flops(B, H, N, N, d)
             + traffic.model_flops(B, H, N, N, d, backward=True))
    bwd = traffic.totals(traffic.flash_backward(B, H, N, N, d))["flops"]
    return _close(answer, hw / model, "the ratio", 0.01, hints=[
        (bwd / traffic.model_flops(B, H, N, N, d, backward=True),
         "that is the backward alone: the forward (no recompute) is in both counts"),
        (1.0, "the recompute of S is executed (hardware FLOPs) but is not useful work"),
    ], hint="per (i, j) pair: forward 4 d, backward 8 d useful, plus 2 d recomputed")


def fig2_bytes_ratio(answer, B: int = 64, H: int = 16, N: int = 1024, d: int = 64) -> Verdict:
    """Naive HBM bytes / flash HBM bytes for forward + backward at (B, H, N, d) (GPT-2 medium in
    FlashAttention's Fig. 2 by default), from ckptlab's kernels (the traffic models)."""
    naive = traffic.totals(traffic.naive_forward(B, H, N, N, d)
                           + traffic.naive_backward(B, H, N, N, d))["bytes"]
    want = naive / _flash_fwd_bwd(B, H, N, d)["bytes"]
    return _close(answer, want, "the ratio", 0.02, hint="sum the bytes of every launch of each "
                  "method (traffic.totals) and divide")


# ---- lab 06: dropout and determinism --------------------------------------------------------
def mask_bytes(answer, B: int = 64, H: int = 16, N: int = 1024) -> Verdict:
    """Bytes a stored dropout mask of attention's P would take, kept as ckptlab's boolean keep
    mask (rng.keep_mask), for (B, H, N, N)."""
    per = rng.keep_mask(0, 0, (1,), 0.5).itemsize  # bytes per element of the mask it draws
    want = B * H * N * N * per
    return _exact(answer, want, "the byte count", hints=[
        (want * traffic.BYTES, "a keep mask is bool (1 byte per element), not fp32"),
        (want / 8, "NumPy stores a bool in a byte, not a bit (a packed mask would be 1/8)"),
    ], hint="the mask has P's shape (B, H, N, N)")


def deterministic_flops_ratio(answer, B: int = 64, H: int = 16, N: int = 1024,
                              d: int = 64) -> Verdict:
    """Hardware FLOPs of the deterministic flash backward over those of the atomic one (not
    causal): what bitwise reproducibility costs in arithmetic."""
    det, atomic = (traffic.totals(traffic.flash_backward(B, H, N, N, d, deterministic=x))["flops"]
                   for x in (True, False))
    return _close(answer, det / atomic, "the ratio", 0.01, hints=[
        (1.0, "the deterministic dq kernel recomputes S and dP = dO V^T a second time"),
    ], hint="atomic: 10 d FLOPs per (i, j) pair (S, dP, dV, dK, dQ); the deterministic path "
            "does 8 d in dkdv, then S, dP and dQ again (6 d) in the dq kernel")


# ---- lab 07: segment checkpointing ----------------------------------------------------------
def least_memory_segments(answer, prof) -> Verdict:
    """The number k of uniform checkpointed segments (schedules.uniform(L, k)) that gives the
    chain profiled in `prof` (ledger.Profile) the least predicted peak of saved bytes. Any k
    whose peak is within 10% of the least counts: the curve is flat and bumpy near its bottom
    (segments of unequal length), and the estimate sqrt(L a / x) ignores the head."""
    L = prof.n_blocks
    peaks = {k: schedules.uniform(L, k).predict(prof).peak_bytes for k in range(1, L + 1)}
    best = min(peaks, key=peaks.get)
    if _unanswered(answer):
        return Verdict(NOT_YET)
    got, bad = _number(answer, "k")
    if bad:
        return bad
    if got != int(got) or not 1 <= got <= L:
        return _wrong(f"k is a whole number of segments from 1 to L = {L}; you gave {answer!r}")
    k = int(got)
    if peaks[k] <= 1.10 * peaks[best]:
        return _right()
    side = ("more segments: each recompute holds L / k blocks' activations at once" if k < best
            else "fewer segments: each one holds its input until the backward reaches it")
    return _wrong(f"k = {k} peaks at {peaks[k] / peaks[best]:.2f}x the least; try {side}")


def checkpoint_flops_ratio(answer, prof) -> Verdict:
    """Hardware FLOPs / model FLOPs (= HFU / MFU) of one training step of the chain profiled in
    `prof` under the sqrt schedule (every block checkpointed once)."""
    pred = schedules.sqrt(prof.n_blocks).predict(prof)
    return _close(answer, pred.hardware_flops / pred.model_flops, "the ratio", 0.01, hints=[
        (2.0, "the recompute is one more forward per block, not a forward and a backward"),
        (1.5, "a backward costs about twice a forward, so a step is about three forwards"),
    ], hint="hardware = model + one extra forward of the blocks; backward ~ 2 x forward")


# ---- lab 08: schedules and budgets ----------------------------------------------------------
def _schedule(answer, L, prof):
    """(Schedule, None) from a spec string, a Schedule or a plan list; else (None, Verdict)."""
    try:
        if isinstance(answer, str):
            if answer.strip().startswith("optimal"):
                return None, _wrong("optimal(...) is the DP's own answer: build a schedule "
                                    "yourself (a spec like every(2), or a plan list)")
            return schedules.make(answer, L, prof), None
        if isinstance(answer, schedules.Schedule):
            if answer.name.startswith("optimal"):
                return None, _wrong("that is the DP's own answer: build a schedule yourself")
            return answer, None
        if isinstance(answer, list):
            return schedules.Schedule("yours", answer), None
    except (TypeError, ValueError) as e:
        return None, _wrong(f"the schedule cannot be built: {e}")
    return None, _wrong(f"give a spec string, a Schedule or a plan list; you gave "
                        f"{type(answer).__name__}")


def schedule_for_budget(answer, prof, fraction: float = 0.4) -> Verdict:
    """A schedule (spec, Schedule or plan; not optimal(...)) whose predicted peak of saved
    bytes fits `fraction` of the no-checkpointing peak and which recomputes fewer FLOPs than
    the sqrt schedule."""
    if _unanswered(answer):
        return Verdict(NOT_YET)
    L = prof.n_blocks
    budget = fraction * schedules.none(L).predict(prof).peak_bytes
    sqrt = schedules.sqrt(L).predict(prof)
    sched, bad = _schedule(answer, L, prof)
    if bad:
        return bad
    try:
        pred = sched.predict(prof)
    except (TypeError, ValueError) as e:
        return _wrong(f"the schedule cannot be run on this chain: {e}")
    if pred.peak_bytes > budget:
        return _wrong(f"its peak is {pred.peak_bytes:,} bytes, over the budget of {budget:,.0f}")
    if pred.recompute_flops >= sqrt.recompute_flops:
        return _wrong(f"it fits, but recomputes {pred.recompute_flops:,} FLOPs, no fewer than "
                      f"sqrt's {sqrt.recompute_flops:,}: keep the last blocks' activations "
                      "(freed first in the backward) and checkpoint the rest")
    return _right()


def korthikanti_bytes(answer, s: int, b: int, h: int, a: int) -> Verdict:
    """Bytes of activations one transformer layer holds for its backward with no recompute
    (Korthikanti et al. 2022, 16-bit): sequence s, micro-batch b, hidden h, a heads."""
    want = at_scale.layer_activation_bytes(s, b, h, a, "none")
    return _exact(answer, want, "the byte count", hints=[
        (at_scale.layer_activation_bytes(s, b, h, a, "selective"),
         "that leaves out the attention core's 5 a s^2 b bytes (QK^T, softmax, dropout)"),
    ], hint="s b h (34 + 5 a s / h)")


def selective_saving(answer, s: int, b: int, h: int, a: int) -> Verdict:
    """The fraction of one layer's activation bytes that selective recompute (of the attention
    core) saves against none: 1 - selective / none."""
    want = 1 - (at_scale.layer_activation_bytes(s, b, h, a, "selective")
                / at_scale.layer_activation_bytes(s, b, h, a, "none"))
    return _close(answer, want, "the fraction", 0.01, hints=[
        (100 * want, "a fraction, not a percentage"),
    ], hint="the saved part is 5 a s / h out of 34 + 5 a s / h")
