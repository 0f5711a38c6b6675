"""Published PyTorch FSDP (ZeRO-3) training runs of GPT models on A100s, held against the step
model by `python -m ckptlab bench plan-check` (ckptlab.cluster.published_runs makes them Runs).

MosaicML llm-foundry, scripts/train/benchmarking (its README) ("MPT Training Benchmarks"), the
tables "A100 80GB with 1600 Gbps node-node interconnect (RoCE)" and "A100 40GB with 1600 Gbps
node-node interconnect (RoCE)": MPT models trained with Composer's PyTorch FSDP, sharding
strategy FULL_SHARD, no tensor or pipeline parallelism, FlashAttention (attn_impl triton), bf16,
with the micro-batch, gradient accumulation, global batch, activation checkpointing (every
block, or none) and the measured throughput in tokens a second per GPU of each run. The models
(scripts/train/yamls/pretrain/mpt-*.yaml; the NumParams column confirms them, 12 L h^2 + V h +
s h + 13 L h + 2 h): GPT layers (4h GeLU MLP, LayerNorm, biases), vocabulary 50,368, learned
positions, tied embeddings, no dropout; loss PyTorch's cross-entropy.

The published throughput is tokens/s per GPU; its teraFLOP/s here are those tokens at
Korthikanti et al.'s model FLOPs per token (72 L s h^2 (1 + s/(6h) + V/(12 h L)) / s), the
count the step model reports in, so the error is the throughput's.
"""

from __future__ import annotations

FOUNDRY = ("MosaicML llm-foundry, scripts/train/benchmarking (its README), 'MPT Training "
           "Benchmarks'")
VOCAB, SEQ = 50368, 2048
MPT = {  # name -> (heads, hidden, layers): scripts/train/yamls/pretrain/mpt-<name>.yaml
    "1b": (16, 2048, 24), "3b": (20, 2560, 32), "7b": (32, 4096, 32), "13b": (40, 5120, 40),
    "30b": (56, 7168, 48), "70b": (64, 8192, 80),
}
# (model, GPU, GPUs, micro-batch, global batch, activation checkpointing, tokens/s per GPU,
#  MFU % as printed), each a row of the table named by its GPU, at SeqLen 2048
ROWS = [
    ("1b", "A100-SXM4-80GB", 8, 14, 448, False, 20513, 59.86),
    ("3b", "A100-SXM4-80GB", 8, 10, 160, False, 10811, 62.11),
    ("7b", "A100-SXM4-80GB", 8, 6, 96, False, 4641, 64.23),
    ("13b", "A100-SXM4-80GB", 8, 2, 48, False, 2262, 59.57),
    ("30b", "A100-SXM4-80GB", 8, 3, 504, True, 916, 55.3),
    ("70b", "A100-SXM4-80GB", 64, 8, 2048, True, 410, 53.33),
    ("3b", "A100-SXM4-40GB", 128, 6, 768, False, 9538, 54.8),
    ("7b", "A100-SXM4-40GB", 128, 18, 2304, True, 3623, 50.14),
    ("13b", "A100-SXM4-40GB", 128, 16, 2048, True, 1972, 51.93),
    ("70b", "A100-SXM4-40GB", 128, 4, 512, True, 376, 48.91),
]


def model_flops_per_token(heads: int, hidden: int, layers: int) -> float:
    """Korthikanti et al.'s model FLOPs of one token, forward and backward."""
    s, h, L, V = SEQ, hidden, layers, VOCAB
    return 72 * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L)) / s


def name_of(row) -> str:
    model, gpu, gpus = row[:3]
    return f"mpt-{model}/{gpus}x{'40' if '40GB' in gpu else '80'}"


def source_of(row) -> str:
    model, gpu, gpus, b, batch, ckpt = row[:6]
    table = "A100 40GB" if "40GB" in gpu else "A100 80GB"
    return (f"{FOUNDRY}, table '{table} with 1600 Gbps node-node interconnect (RoCE)', row "
            f"{model}, SeqLen 2048, {gpus} GPUs, MicroBatchSize {b}, GlobalBatchSize {batch}, "
            f"activation checkpointing {ckpt}")
