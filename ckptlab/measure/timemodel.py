"""Modeled time of attention on a named GPU: a launch cost, then waves of blocks at the roofline.

Per launch of a kernel with F FLOPs and M bytes of HBM traffic in `blocks` blocks:

    slots  = SMs x resident blocks per SM    (blocks that run at once: measure.occupancy)
    waves  = ceil(blocks / slots)
    t      = LAUNCH_S + waves x max(slots F / blocks / peak, slots M / blocks / bandwidth)

The work is spread evenly over the blocks and each block gets 1/slots of the GPU's peak and
bandwidth, so a wave lasts as long as a full one even when fewer blocks are left: a one-block
launch runs at 1/slots of the GPU, never at the whole GPU's rate. When the blocks fill whole
waves, t = LAUNCH_S + max(F / peak, M / bandwidth), the plain roofline plus the launch cost.

Bytes come in two bounds (docs/design.md, "Measurement"): **unique** bytes (distinct bytes a
launch touches: what an infinite cache would move) give the lower bound of the time, **counted**
bytes (every request, no cache) the upper. Real DRAM traffic lies between the two. FLOPs are the
hardware matmul FLOPs of ckptlab.measure.traffic or traffic_tc (recompute included). Left out:
exp, max and sums, the special-function units that run exp (on tensor-core parts exp can bound
attention), L2, clocks below boost, overlapping launches. All of it modeled, and labelled so.

dtype "fp32" times the fp32 kernels (CUDA cores, 4-byte elements: ckptlab.measure.traffic).
"bf16" (or "fp16") times what runs on tensor cores where a kernel exists: stored and flash are
the tensor-core pair (kernels/attn_flash_*_tc.cu), with their own launches, tiles, registers and
dynamic shared memory, their bytes as ckptlab.measure.traffic_tc models them (2-byte elements;
L, D, stored's S and the atomic dQ's accumulator fp32) and their FLOPs at the tensor-core peak.
naive has no tensor-core kernel: at 16 bits it is a what-if (MethodTime.what_if), the fp32
kernels' launches and resources with 2-byte elements (L, D, atomics fp32) at the tensor-core peak.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptlab.kernels.common import ceil_div
from ckptlab.measure import occupancy, roofline, traffic, traffic_tc

LAUNCH_S = 3e-6
LAUNCH_SOURCE = (
    "about 3 us per launch: 'the launch overhead of null kernels ... appears to have been "
    "reduced to about 3 microseconds with recent hardware and software' (NVIDIA developer "
    "forums, https://forums.developer.nvidia.com/t/too-much-time-for-kernel-launch-latency/"
    "233645/3)"
)
DTYPES = {"fp32": 4, "bf16": 2, "fp16": 2}  # element bytes (16-bit: tensor-core peak)
FP32_ARGS = ("L", "D")  # kept in fp32 whatever the element type (logsumexp, rowsum(dO * O))
BOUNDS = ("unique", "counted")  # lower, upper
TC_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}  # -> traffic_tc's names (table.TC_TYPES)
SCORE_BYTES = 4  # the stored kernels keep S in fp32, in both precisions (traffic, traffic_tc)
KERNELS_NOTE = {
    "fp32": "the fp32 kernels (CUDA cores)",
    "tc": "the tensor-core kernels (kernels/attn_flash_*_tc.cu, bytes: measure.traffic_tc)",
    "what-if": "what-if: no tensor-core kernel, the fp32 kernels' launches at 2-byte elements",
}


@dataclass(frozen=True)
class LaunchTime:
    """One launch, modeled: seconds = launch_s + waves x max(compute_s, memory_s), where
    compute_s and memory_s are one wave's (slots blocks at 1/slots of the GPU each)."""

    kernel: str
    blocks: int
    threads: int
    resident: int  # blocks per SM
    limiter: str  # what limits resident: blocks, threads, registers or shared memory
    slots: int  # SMs x resident
    waves: int
    flops: float
    bytes: float
    compute_s: float
    memory_s: float
    launch_s: float
    device: str
    dtype: str
    resources: str  # where registers and shared memory came from
    source: str = "modeled"

    @property
    def wave_s(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def seconds(self) -> float:
        return self.launch_s + self.waves * self.wave_s

    @property
    def bound(self) -> str:
        """What the time mostly is: 'launch' (the fixed cost), else 'compute' or 'memory'."""
        if self.launch_s >= self.waves * self.wave_s:
            return "launch"
        return "compute" if self.compute_s > self.memory_s else "memory"


def short_name(device) -> str:
    """'A100-SXM4-80GB' -> 'A100', 'RTX-4090' -> 'RTX-4090': a column label."""
    name = roofline.spec(device)["name"]
    return name if name.startswith("RTX") else name.split("-")[0]


def launch_time(kernel: str, blocks: int, threads: int, flops, nbytes, device,
                dtype: str = "fp32", res: occupancy.Resources | None = None,
                achievable: float = 1.0) -> LaunchTime:
    """Modeled time of one launch of `kernel` (`blocks` blocks of `threads` threads doing `flops`
    FLOPs and moving `nbytes` bytes in all) on `device`. `res` defaults to the compiler's report
    for the device's arch (occupancy.resources). `achievable`: the fraction of the peak FLOP/s
    the arithmetic reaches (1: the roofline; see ckptlab.cli.model_check for a measured one)."""
    if not 0 < achievable <= 1:
        raise ValueError(f"achievable: expected a fraction in (0, 1], got {achievable!r}")
    s = roofline.spec(device)
    if not isinstance(blocks, int) or blocks < 1:
        raise ValueError(f"blocks: expected a positive int, got {blocks!r}")
    flops = roofline.check_count("flops", flops)
    nbytes = roofline.check_count("nbytes", nbytes)
    res = occupancy.resources(kernel, s["arch"]) if res is None else res
    resident, limiter = occupancy.resident_blocks(threads, res, s)
    slots = s["sms"] * resident
    share = slots / blocks  # each block's work, times the blocks of one full wave
    return LaunchTime(
        kernel, blocks, threads, resident, limiter, slots, ceil_div(blocks, slots), flops,
        nbytes, share * flops / (achievable * roofline.peak_flops(s, dtype)),
        share * nbytes / s["hbm_bytes_per_s"], LAUNCH_S, s["name"], dtype, res.source)


def resources_note(device) -> str:
    """Where the registers and shared memory behind the waves come from on `device`: the
    compiler's report, or (no compiler) the tile table with registers unknown."""
    arch = roofline.spec(device)["arch"]
    return occupancy.resources("attn_naive_scores", arch).source


# ---------------------------------------------------------------- bytes per launch


def _scaled(per_arg: dict, element_bytes: int) -> int:
    """Bytes of fp32 elements at `element_bytes` an element (FP32_ARGS unchanged)."""
    return sum(b if name in FP32_ARGS else b * element_bytes // 4 for name, b in per_arg.items())


def launch_bytes(kt: traffic.KernelTraffic, dtype: str = "fp32") -> dict:
    """{'unique': ..., 'counted': ...} DRAM bytes of one launch's model. An fp32 kernel's model
    (traffic) is rescaled to the element size of `dtype` (FP32_ARGS and atomics stay 4 bytes:
    fp32 accumulators); a tensor-core kernel's (traffic_tc) already has its own element sizes
    and is taken as modeled. An atomicAdd is a read-modify-write: 2 x 4 bytes an operation with
    no cache, as unique bytes count an atomically updated byte once read and once written; so
    unique <= counted here even where a dQ element gets a single atomic (the traffic models'
    counted `bytes` count 4 bytes an operation)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {sorted(DTYPES)}, got {dtype!r}")
    e = 4 if occupancy.is_tensor_core(kt.kernel) else DTYPES[dtype]  # 4: no rescaling
    counted = {n: kt.read[n] + kt.write[n] for n in kt.read}
    unique = {n: kt.unique_read[n] + kt.unique_write[n] for n in kt.unique_read}
    return {"counted": _scaled(counted, e) + 2 * kt.atomic_bytes,
            "unique": _scaled(unique, e) + kt.unique_atomic_bytes}


# ---------------------------------------------------------------- a method's forward + backward


@dataclass(frozen=True)
class MethodTime:
    """Forward + backward of one attention method, modeled: the launches at each byte bound."""

    method: str
    device: str
    dtype: str
    launches: dict  # bound ("unique" | "counted") -> [LaunchTime, ...]
    kernels: str = KERNELS_NOTE["fp32"]  # which kernels were timed (KERNELS_NOTE)
    what_if: bool = False  # True: no such kernel runs (naive at 16 bits)

    def seconds(self, bound: str) -> float:
        return sum(x.seconds for x in self.launches[bound])

    @property
    def lower(self) -> float:
        return self.seconds("unique")

    @property
    def upper(self) -> float:
        return self.seconds("counted")

    @property
    def launch_s(self) -> float:
        return sum(x.launch_s for x in self.launches["counted"])

    @property
    def resources(self) -> str:
        return "; ".join(sorted({x.resources for x in self.launches["counted"]}))


def timed_launches(method: str, B, H, Nq, Nk, d, causal=False, deterministic=False,
                   dtype: str = "fp32") -> tuple[list, str]:
    """(the modeled launches method_time times, its KERNELS_NOTE key): the fp32 kernels'
    (traffic.launches) in fp32; at 16 bits the tensor-core pair's (traffic_tc.tc_launches) for
    stored and flash, and the fp32 kernels' as a what-if for naive (no tensor-core kernel)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {sorted(DTYPES)}, got {dtype!r}")
    if dtype == "fp32":
        return traffic.launches(method, B, H, Nq, Nk, d, causal, deterministic), "fp32"
    if method in traffic_tc.METHODS:
        return traffic_tc.tc_launches(method, B, H, Nq, Nk, d, causal, deterministic,
                                      TC_DTYPES[dtype]), "tc"
    return traffic.launches(method, B, H, Nq, Nk, d, causal, deterministic), "what-if"


PARTS = ("both", "forward", "backward")


def method_time(method: str, B, H, Nq, Nk, d, device, *, causal=False, deterministic=False,
                dtype: str = "fp32", achievable: float = 1.0, part: str = "both") -> MethodTime:
    """Every launch of `method`'s forward + backward (timed_launches) timed at both bounds, or
    only the forward's or the backward's launches (`part`; a backward kernel's name has _bwd);
    `achievable` as in launch_time."""
    if part not in PARTS:
        raise ValueError(f"part: expected one of {PARTS}, got {part!r}")
    name = roofline.spec(device)["name"]
    out: dict = {b: [] for b in BOUNDS}
    runs, kind = timed_launches(method, B, H, Nq, Nk, d, causal, deterministic, dtype)
    if part != "both":
        runs = [kt for kt in runs if ("_bwd" in kt.kernel) == (part == "backward")]
    for kt in runs:
        blocks, threads = occupancy.geometry(kt.kernel, B, H, Nq, Nk, d)
        nbytes = launch_bytes(kt, dtype)
        for bound in BOUNDS:
            out[bound].append(launch_time(kt.kernel, blocks, threads, kt.flops, nbytes[bound],
                                          name, dtype, achievable=achievable))
    return MethodTime(method, name, dtype, out, KERNELS_NOTE[kind], kind == "what-if")


# ---------------------------------------------------------------- the decomposition

CHAIN = ("naive", "stored", "flash")
WHAT_DIFFERS = {
    "fusion": "naive -> stored: fusion and tiles (unfused launches on 16 x 16 tiles with S, P, "
              "dP and dS through HBM, against the fused flash-tiled launches); an N x N "
              "matrix is saved in both (naive: P; stored: S)",
    "recompute": "stored -> flash: only where P comes from (P = exp(S - L) from S read back "
                 "from HBM, or from S recomputed from Q and K); same tiles, launches and loops",
    "product": "naive -> flash: both at once (what FlashAttention's headline numbers compare)",
}


def decomposition(values: dict) -> dict:
    """From one quantity per method (time, bytes...; lower is better): fusion gain =
    naive / stored, recompute gain = stored / flash, product = naive / flash (= fusion x
    recompute)."""
    missing = [m for m in CHAIN if m not in values]
    if missing:
        raise ValueError(f"values: expected one number per method {CHAIN}, missing {missing}")
    n, s, f = (float(values[m]) for m in CHAIN)
    return {"fusion": n / s, "recompute": s / f, "product": n / f}



def fills_one_wave(kernel: str, B, H, Nq, Nk, d, device) -> bool:
    """Whether a launch of `kernel` has at least as many blocks as the GPU runs at once."""
    s = roofline.spec(device)
    blocks, threads = occupancy.geometry(kernel, B, H, Nq, Nk, d)
    resident, _ = occupancy.resident_blocks(threads, occupancy.resources(kernel, s["arch"]), s)
    return blocks >= s["sms"] * resident


def fills_waves_from(B, H, d, device, methods=CHAIN, *, causal=False, deterministic=False,
                     n_max: int = 1 << 20) -> int | None:
    """The smallest power-of-two N (Nq = Nk) at which every launch of `methods` (their fp32
    kernels: what bench attention times) fills at least one wave on `device`: below it some
    launch runs on part of the GPU and the model mostly says launch costs and partial waves;
    from it on, the roofline term means something. None if no N up to n_max does."""
    names = {kt.kernel for m in methods
             for kt in traffic.launches(m, 1, 1, 1, 1, d, causal, deterministic)}
    n = 64
    while n <= n_max:
        if all(fills_one_wave(k, B, H, n, n, d, device) for k in names):
            return n
        n *= 2
    return None


def s_exceeds_l2_from(device, B: int = 1, H: int = 1, score_bytes: int = SCORE_BYTES) -> int:
    """The smallest power-of-two N at which stored's S (B H N^2 scores of score_bytes) is larger
    than `device`'s L2. Unique bytes are a lower bound on a launch's DRAM traffic with a cold
    cache (what Nsight Compute's default cache control gives each launch); in back-to-back
    timed runs a smaller S can stay in L2 between stored's forward and backward. From this N on
    S cannot stay in L2 whole; up to the L2's size of it still can (traffic that much lower)."""
    for name, x in (("B", B), ("H", H)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ValueError(f"{name}: expected a positive int, got {x!r}")
    score_bytes = roofline.check_count("score_bytes", score_bytes, positive=True)
    l2 = roofline.spec(device)["l2_bytes"]
    n = 1
    while B * H * n * n * score_bytes <= l2:
        n *= 2
    return n
