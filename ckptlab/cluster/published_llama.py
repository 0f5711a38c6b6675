"""Published training runs of Llama-family models that the step model is held against
(`python -m ckptlab bench plan-check`, its Llama section): every row held out, none used to fit
anything. Each row with the document, version and table row it comes from.

torchtitan (PyTorch's pretraining stack), its performance page (docs/performance):
  - at commit 1ea476e9f (2024-04-24), "Llama 3 performance numbers", FSDP2 on 64 A100 80GB, local
    batch 1 (global 64), sequence 8,192 (train_configs/llama3_8b.toml, llama3_70b.toml):
    8B with selective op activation checkpointing, 2,973 tokens/s a GPU, 58.2% MFU; 70B with
    full checkpointing, 331 tokens/s, 51.7%.
  - at commit 3faaa1a0d (2024-08-23), "Llama 3.1 performance numbers": 405B on 128 H100 (94 GB;
    its footnote: "HBM2e based lower TDP SXM H100", the MFU taken against the SXM peak), FSDP2
    16 x TP 8 (train_configs/llama3_405b.toml: tensor_parallel_degree 8, seq_len 8192), local
    batch 2 (global 32), full checkpointing, no Float8: 109 tokens/s, 29.0%.
torchtitan's MFU (train.py of each commit): tokens/s x (6 N + 12 L h s) / peak, per GPU, with
N every parameter (1ea476e9f: get_num_params(model)) or every parameter less the token
embedding (3faaa1a0d: exclude_embedding=True), 12 L h s the attention core's forward and
backward (causal masking not discounted), the peak 312 TFLOP/s (A100) or 989 (H100 SXM). The
published tokens/s times this count over the peak gives back the published MFU (58.2, 51.7,
29.0%): this is the count the rows are compared in.

Meta's Llama 3 paper (Dubey et al. 2024, arXiv 2407.21783) gives its 405B layouts on 8K and 16K
H100s (TP 8, CP 1 or 16, PP 16, DP 64 / 128 / 8) with 38-43% BF16 MFU; its rows are left out
here until the batch and the MFU of each layout are carried from the paper's table itself.

What the model is told of each run: FSDP2 is ZeRO-3 (parameters, gradients and Adam state
sharded: fp32 master weights and state, 16 bytes a parameter, step_memory's "bf16"), bf16
compute, PyTorch's cross-entropy without tensor parallelism and a vocabulary-parallel one with
it (torchtitan's loss_parallel), sequence parallelism with TP (torchtitan's plan shards the
norms' activations by sequence), FlashAttention (SDPA's flash backend). "selective op" (save
the matmul and attention outputs, recompute the rest) is closest to the model's FlashAttention
base with the fewest whole layers that fit; "full" recomputes every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptlab.cluster.llama_layer import LlamaShape

TORCHTITAN_A100 = ("torchtitan's performance page (docs/performance) at commit 1ea476e9f "
                   "(2024-04-24), 'Llama 3 performance numbers', FSDP2 on 64 A100 80GB")
TORCHTITAN_405B = ("torchtitan's performance page (docs/performance) at commit 3faaa1a0d "
                   "(2024-08-23), 'Llama 3.1 performance numbers', 128 H100 (94 GB), FSDP2 + TP 8")
PEAK = {"A100-SXM4-80GB": 312e12, "H100-SXM5-80GB": 989e12}  # torchtitan's get_peak_flops


@dataclass(frozen=True)
class LlamaRun:
    name: str
    source: str
    model: LlamaShape
    gpu: str
    memory: float  # bytes a GPU
    gpus: int
    t: int
    micro_batch: int  # local batch a data-parallel rank
    recompute: str  # "selective op" or "full"
    tokens_per_s: float  # published, a GPU
    mfu_pct: float  # published
    embedding_counted: bool  # torchtitan's N: every parameter (True) or less the embedding

    @property
    def d(self) -> int:
        return self.gpus // self.t

    def flops_per_token(self) -> float:
        """torchtitan's count: 6 N + 12 L h s."""
        m = self.model
        n = m.params() - (0 if self.embedding_counted else m.vocab * m.hidden)
        return 6 * n + 12 * m.layers * m.hidden * m.seq

    def published_tflops(self) -> float:
        """Teraflop/s a GPU in torchtitan's count: its MFU times its peak."""
        return self.mfu_pct / 100 * PEAK[self.gpu] / 1e12


LLAMA3_8B = LlamaShape(32, 4096, 32, 8, 14336, 8192, 128256)
LLAMA3_70B = LlamaShape(80, 8192, 64, 8, 28672, 8192, 128256)
LLAMA3_405B = LlamaShape(126, 16384, 128, 8, 53248, 8192, 128256)
A100_MEMORY = 80 * 2**30
H100_94GB = 94e9

RUNS = [
    LlamaRun("tt 8B", f"{TORCHTITAN_A100}, row 8B, selective op", LLAMA3_8B, "A100-SXM4-80GB",
             A100_MEMORY, 64, 1, 1, "selective op", 2973, 58.2, True),
    LlamaRun("tt 70B", f"{TORCHTITAN_A100}, row 70B, full", LLAMA3_70B, "A100-SXM4-80GB",
             A100_MEMORY, 64, 1, 1, "full", 331, 51.7, True),
    LlamaRun("tt 405B", f"{TORCHTITAN_405B}, row 405B, full, no optimizations", LLAMA3_405B,
             "H100-SXM5-80GB", H100_94GB, 128, 8, 2, "full", 109, 29.0, False),
]
