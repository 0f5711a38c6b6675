"""ckptlab on PyTorch: the kernels as autograd functions, the schedules on torch modules, and
more than one process on PyTorch's own distributed engine.

    from ckptlab import torch as ct
    O = ct.attention(q, k, v, causal=True, method="flash")         # torch tensors, autograd
    O = ct.FlashAttention.apply(q, k, v, is_causal)                # CS336's call, (B, N, d)
    out = ct.flash_attn_func(q, k, v, dropout_p, causal=True)      # flash_attn's, (B, N, H, d)
    y = ct.checkpoint_sequential(blocks, x, schedule="optimal(40%)")

    arrays.py     zero-copy views: CPU tensors <-> NumPy (the emulator), CUDA <-> CuPy (DLPack)
    attention.py  the kernels as a torch.autograd.Function; what it saves is the kernel's Saved;
                  (B, N, d) inputs as one head; FlashAttention / StoredAttention /
                  NaiveAttention.apply(q, k, v, is_causal), Stanford CS336's call
    launch.py     the launches both run, with an autograd ctx or without; flop_counter
    compiled.py   the same kernels as torch.library custom operators, which torch.compile
                  records as one call each (attention.py routes to them while it traces)
    flash_attn.py flash_attn_func, _qkvpacked_func, _kvpacked_func: FlashAttention 2's interface
                  (layout, MQA / GQA, softmax_lse, S_dmask) over the flash kernels
    flash_attn_varlen.py  flash_attn_varlen_func and its packed forms: sequences of different
                  lengths packed along one axis (cu_seqlens), one flash call per sequence
    bert_padding.py  unpad_input / pad_input: a padded batch to packed tokens and cu_seqlens
    ledger.py     saved-tensor bytes through saved_tensors_hooks, by storage, over time
    profile.py    a ckptlab Profile of a torch chain, measured from its saved tensors
    selective.py  ckptlab's selective policies as PyTorch selective-checkpoint policies
    recomputing.py  recompute(attn): an op's insides as a checkpoint of their own
    schedule.py   checkpoint_sequential: any ckptlab plan with torch.utils.checkpoint
    nets.py       a torch MLP and a small GPT as chains of modules
    dist.py       processes: spawn ranks into a gloo (CPU) or NCCL (GPU) group
    tensor_parallel.py  Megatron's column/row split of a transformer block, bytes vs formula
    demo.py       python -m ckptlab.torch.demo --nproc 2: DDP training, bytes vs prediction
    fsdp.py       the same GPT under FSDP2 (--fsdp): bytes per rank by kind vs step_memory
    gpt_bytes.py  what nets.GPT saves, on paper, for the attention it runs; one stage's peak
    pipeline.py   pipeline stages on paper: layers per stage, GPipe's and 1F1B's order, the
                  micro-batches in flight, a stage's peak from ckptlab's prediction
    pipelined.py  the same GPT on torch.distributed.pipelining (--pipeline): bytes per stage
    op_plan.py    an op-level recompute plan (DP over ops and stages) as selective checkpointing

PyTorch is optional (pip install -e '.[torch]'); without it importing this package raises one
ImportError line that says how to install it.
"""

try:
    import torch as _torch  # noqa: F401  (absolute: the real PyTorch, not this package)
except ImportError:
    raise ImportError("ckptlab.torch needs PyTorch, which is not installed: "
                      "pip install -e '.[torch]' (CPU build: pip install torch==2.13.0 "
                      "--index-url https://download.pytorch.org/whl/cpu)") from None

from ckptlab.torch.attention import (
    METHODS,
    FlashAttention,
    NaiveAttention,
    StoredAttention,
    attention,
    attention_with_lse,
    flop_counter,
)
from ckptlab.torch.flash_attn import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
)
from ckptlab.torch.flash_attn_varlen import (
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from ckptlab.torch.ledger import TorchLedger
from ckptlab.torch.profile import profile
from ckptlab.torch.recomputing import recomputed, recomputing
from ckptlab.torch.schedule import checkpoint_sequential, make_schedule, run_plan
from ckptlab.torch.selective import context_fn, sac_policy

__all__ = ["METHODS", "FlashAttention", "NaiveAttention", "StoredAttention", "TorchLedger",
           "attention", "attention_with_lse", "checkpoint_sequential", "context_fn",
           "flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func",
           "flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func",
           "flash_attn_varlen_qkvpacked_func",
           "flop_counter", "make_schedule", "profile", "recomputed", "recomputing", "run_plan",
           "sac_policy"]
