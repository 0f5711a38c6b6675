"""Published training runs of GPT models on A100s (Megatron-LM's, and PyTorch FSDP's in
ckptlab.cluster.fsdp_runs) that ckptlab's step model is held against
(`python -m ckptlab bench plan-check`), each row with the paper, table and row it comes from.

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (SC'21, arXiv 2104.04473), Table 1 ("Weak-scaling throughput for GPT models
ranging from 1 billion to 1 trillion parameters"): ten GPT models on Selene's DGX A100 80GB
nodes, vocabulary 51,200, sequence 2048, with heads, hidden size, layers, tensor-parallel size
t, pipeline size p, GPUs, batch and the achieved teraFLOP/s per GPU, counted as their Eq. 3,
96 B s l h^2 (1 + s/(6h) + V/(16 l h)): full activation recompute, and the head. Table 1 gives
neither the micro-batch nor the schedule: the model takes, for the published t, p and d, the
micro-batch and virtual stages it finds fastest (said so in each row).

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv 2205.05198): Table 3 (the configurations: heads, hidden, layers, t, p, GPUs, global
batch, micro-batch; the interleaved schedule with 3 virtual stages for 175B and 530B; none is
given for 1T, so the model picks its virtual stages) and Table 5 (iteration time with
sequence parallelism and selective recompute, model and hardware FLOPs utilisation, MFU /
HFU: 22B 41.5 / 43.7%, 175B 51.4 / 52.8%, 530B 56.0 / 57.0%, 1T 56.3 / 57.0%; the Megatron-LM
README reproduces the same table). MFU counts model FLOPs,
72 B L s h^2 (1 + s/(6h) + V/(12 h L)), against the A100's 312 TFLOP/s.

Assumptions the rows share (the papers say "mixed precision"): 16-bit weights and gradients
with fp32 master weights and Adam (step_memory's "bf16", 16 bytes a parameter), no distributed
optimizer (it came later), the data-parallel all-reduce after the backward (OVERLAP_DP),
Megatron's fused vocabulary-parallel loss, dropout on, DGX A100 80GB nodes (8 GPUs, NVLink, one
200 Gb/s HDR InfiniBand adapter a GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptlab.cluster import fsdp_runs

NARAYANAN = ("Narayanan et al. 2021, 'Efficient Large-Scale Language Model Training on GPU "
             "Clusters Using Megatron-LM', SC'21 (arXiv 2104.04473), Table 1")
KORTHIKANTI = ("Korthikanti et al. 2022, 'Reducing Activation Recomputation in Large "
               "Transformer Models' (arXiv 2205.05198), Table 3 (configuration) and Table 5 "
               "(MFU)")
A100_PEAK = 312e12  # both papers: the A100's 16-bit tensor-core peak (Korthikanti, footnote 5)
SEQ, VOCAB = 2048, 51200  # both papers, every model
# Megatron-LM of 2021-22 all-reduced the data-parallel gradients after the last micro-batch's
# backward (train_step: forward_backward_func, then allreduce_gradients with the default
# DDP_impl 'local'), not overlapped with it; --overlap-grad-reduce came in 2023
OVERLAP_DP = False


@dataclass(frozen=True)
class Run:
    """One published run: the model, its layout, and its throughput per GPU."""

    name: str
    source: str  # paper, table, row
    heads: int
    hidden: int
    layers: int
    t: int
    p: int
    gpus: int
    batch: int
    tflops: float  # published teraFLOP/s per GPU, in the paper's own FLOP count
    flops_count: str  # "narayanan" (Eq. 3, full recompute) or "model" (Korthikanti Eq. 7)
    recompute: str  # what the run recomputed: "full" or "selective"
    sp: bool = False
    micro_batch: int | None = None  # None: not published
    v: int | None = None  # virtual stages; None: not published
    published_pct: float = 0.0  # the percentage of peak the paper prints beside it
    gpu: str = "A100-SXM4-80GB"
    memory_gib: int = 80
    zero: int = 0
    base: str | None = None  # per layer: None = "none" (full) or the recompute named above
    dropout: bool = True
    loss: str = "fused"
    software_of: str | None = None  # SOFTWARE's key; None: the paper's (flops_count)

    @property
    def d(self) -> int:
        return self.gpus // (self.t * self.p)


def _narayanan(row, name, heads, hidden, layers, t, p, gpus, batch, tflops, pct):
    return Run(name, f"{NARAYANAN}, row {row} ({name})", heads, hidden, layers, t, p, gpus,
               batch, tflops, "narayanan", "full", published_pct=pct)


RUNS = [
    # Table 1, row by row: parameters (billions), heads, hidden, layers, t, p, GPUs, batch,
    # achieved teraFLOP/s per GPU, percentage of theoretical peak
    _narayanan(1, "1.7B", 24, 2304, 24, 1, 1, 32, 512, 137, 44),
    _narayanan(2, "3.6B", 32, 3072, 30, 2, 1, 64, 512, 138, 44),
    _narayanan(3, "7.5B", 32, 4096, 36, 4, 1, 128, 512, 142, 46),
    _narayanan(4, "18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135, 43),
    _narayanan(5, "39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138, 44),
    _narayanan(6, "76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140, 45),
    _narayanan(7, "145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148, 47),
    _narayanan(8, "310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155, 50),
    _narayanan(9, "529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163, 52),
    _narayanan(10, "1008.0B", 160, 25600, 128, 8, 64, 3072, 3072, 163, 52),
    # Table 3 configurations; Table 5's MFU x 312 TFLOP/s (model FLOPs per GPU per second)
    Run("22B", f"{KORTHIKANTI}, row 22B", 64, 6144, 48, 8, 1, 8, 4, 0.415 * A100_PEAK / 1e12,
        "model", "selective", sp=True, micro_batch=4, v=1, published_pct=41.5),
    Run("175B", f"{KORTHIKANTI}, row 175B (GPT-3)", 96, 12288, 96, 8, 8, 64, 64,
        0.514 * A100_PEAK / 1e12, "model", "selective", sp=True, micro_batch=1, v=3,
        published_pct=51.4),
    Run("530B", f"{KORTHIKANTI}, row 530B (MT-NLG)", 128, 20480, 105, 8, 35, 280, 280,
        0.560 * A100_PEAK / 1e12, "model", "selective", sp=True, micro_batch=1, v=3,
        published_pct=56.0),
    Run("1T", f"{KORTHIKANTI}, row 1T", 160, 25600, 128, 8, 64, 512, 512,
        0.563 * A100_PEAK / 1e12, "model", "selective", sp=True, micro_batch=1, v=None,
        published_pct=56.3),
]
# Korthikanti et al. 2022, Table 5: seconds an iteration with their method (a check on the MFU:
# model FLOPs / time / GPUs / 312e12 gives 41.6, 51.4, 56.0, 56.3%)
ITERATION_S = {"22B": 1.10, "175B": 13.75, "530B": 37.83, "1T": 71.49}
# Korthikanti et al. 2022, Table 5: hardware FLOPs utilisation (%), beside the MFU above (Run's
# published_pct); HFU over MFU is their accounting of selective recompute (at_scale.hfu_over_mfu)
HFU_PCT = {"22B": 43.7, "175B": 52.8, "530B": 57.0, "1T": 57.0}
# The rows the efficiency curve (ckptlab.cluster.efficiency: E_MAX, X_HALF) is fitted on, named
# before any row's error under that curve was computed, by one property alone: they span the
# per-GPU GEMM width x = h / t the curve is a function of, 768 (18.4B), 1536 (145.6B), 2304
# (1.7B) and 3200 (1008.0B), all in one table (Narayanan's Table 1: one FLOP count, one
# software), few against the rows held out. Every other row (six of Table 1, Korthikanti's
# four, the FSDP runs) is held out and only reported.
CALIBRATION = ("1.7B", "18.4B", "145.6B", "1008.0B")


# What each paper's software could do, for the planner limited to it (bench plan-check): no
# FlashAttention in either (2022); no ZeRO or distributed optimizer (Megatron-LM's came later);
# sequence parallelism and selective recompute are Korthikanti et al.'s own contribution, so
# Narayanan's runs have neither: recompute none, or every layer whole (--checkpoint-activations;
# recomputing only some layers, --recompute-method block, came with Korthikanti's release).
SOFTWARE = {
    "narayanan": dict(bases=("none",), sequence_parallel=False, zero_stages=(0,),
                      partial_full=False),
    "model": dict(bases=("none", "selective"), sequence_parallel=True, zero_stages=(0,)),
    # llm-foundry on Composer (2023): PyTorch FSDP FULL_SHARD, FlashAttention (triton), every
    # block checkpointed or none; tensor parallelism is not limited here
    "composer": dict(bases=("flash",), sequence_parallel=False, zero_stages=(3,),
                     partial_full=False, zero3="fsdp"),
}


def software(r: Run) -> dict:
    """planner.plan's options that the run's own software had (SOFTWARE, by its paper)."""
    return dict(SOFTWARE[r.software_of or r.flops_count])


def run(name: str) -> Run:
    for r in RUNS:
        if r.name == name:
            return r
    raise ValueError(f"run: expected one of {[r.name for r in RUNS]}, got {name!r}")



def _fsdp(row) -> Run:
    """A Run of ckptlab.cluster.fsdp_runs' row: FSDP over every GPU, FlashAttention, every
    block recomputed whole or none."""
    model, gpu, gpus, b, batch, ckpt, tokens, mfu = row
    heads, hidden, layers = fsdp_runs.MPT[model]
    tflops = tokens * fsdp_runs.model_flops_per_token(heads, hidden, layers) / 1e12
    return Run(fsdp_runs.name_of(row), fsdp_runs.source_of(row), heads, hidden, layers, 1, 1,
               gpus, batch, tflops, "model", "full" if ckpt else "flash", micro_batch=b, v=1,
               published_pct=mfu, gpu=gpu, memory_gib=40 if "40GB" in gpu else 80, zero=3,
               base="flash", dropout=False, loss="torch", software_of="composer")


RUNS += [_fsdp(row) for row in fsdp_runs.ROWS]
