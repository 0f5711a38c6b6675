"""The GPU spec table the roofline and the time model read: vendor peak numbers per GPU, each
with the document it was read from (ckptlab.measure.roofline uses it; the test in
tests/test_roofline.py holds every number to having a source).

Peaks are dense (no 2:4 sparsity): NVIDIA's datasheets print the sparse figure for tensor
cores, so the dense figure is half of it. "tensor16" is FP16/BF16 on tensor cores with FP32
accumulation (FP16 only on a T4, whose Turing tensor cores have no bf16).
"""

from __future__ import annotations

KIB = 1024
MIB = 1024 * 1024

# Where each number was read. The primary document is named first; "read via" names the copy
# that was actually consulted when the primary itself was not reachable.
_A100_DATASHEET = (
    "NVIDIA A100 datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/"
    "a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (read via "
    "https://glennklockwood.com/garden/processors/A100)"
)
_AMPERE_TUNING = (
    "CUDA Ampere tuning guide, https://docs.nvidia.com/cuda/ampere-tuning-guide/ ('The NVIDIA "
    "A100 GPU supports shared memory capacity of 0, 8, 16, 32, 64, 100, 132 or 164 KB per SM')"
)
_A100_DEVICEQUERY = (
    "deviceQuery on an A100-SXM4-80GB: 'L2 Cache Size: 41943040 bytes', 'Total shared memory "
    "per multiprocessor: 167936 bytes' (https://gist.github.com/gengwg/3520df2ebf8872e5ee4818367e3a4122)"
)
_H100_DATASHEET = (
    "NVIDIA H100 datasheet/whitepaper table (SXM5: FP32 67 TFLOPS, BF16/FP16 tensor 1,979 "
    "TFLOPS with sparsity, 3,350 GB/s, L2 50 MB, shared memory configurable up to 228 KB per SM), "
    "read via https://archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html"
)
_H200_DATASHEET = (
    "NVIDIA H200 datasheet, https://www.nvidia.com/en-us/data-center/h200/ (141 GB HBM3e at "
    "4.8 TB/s; compute as the H100 SXM: FP32 67 TFLOPS, BF16 tensor 1,979 TFLOPS with sparsity), "
    "read via https://lzwjava.github.io/nvidia-h200-gpu-specs-en and "
    "https://itkb.uw.cz/2026/06/nvidia-h200-vs-b300-precisions-cores.html"
)
_AMPERE_WHITEPAPER = (
    "NVIDIA A100 Tensor Core GPU Architecture whitepaper, https://images.nvidia.com/aem-dam/"
    "en-zz/Solutions/data-center/nvidia-ampere-architecture-whitepaper.pdf (A100: 108 SMs), "
    "read via https://notes.haroldbenoit.com/ML/Engineering/GPUs/Hardware"
)
_H200_L2 = (
    "the H200 itself: cudaDeviceProp.l2CacheSize reports 60 MB (docs/references.md, 'H200: 132 "
    "SMs, 60 MB L2'), taken as 60 MiB like the A100's 40 MiB; the GH100 die has 60 MB of L2 "
    "(https://chipsandcheese.com/2023/07/02/nvidias-h100-funny-l2-and-tons-of-bandwidth/)"
)
_H200_SMS = (
    "132 SMs, the GH100 die as in the H100 SXM (https://ai-hpc.github.io/ai-hardware-engineer-"
    "roadmap/, '01 - H200 Hardware Architecture'; docs/references.md)"
)
_L4_SMS = (
    "7,424 CUDA cores (TechPowerUp data via https://fpsbench.com/compare/gpu/nvidia-l4-vs-nvidia-"
    "tesla-m40) / 128 FP32 lanes per Ada SM = 58 SMs"
)
_COMPUTE_CAPS = (
    "CUDA C++ Programming Guide, compute capabilities table, https://docs.nvidia.com/cuda/"
    "cuda-programming-guide/05-appendices/compute-capabilities.html (max shared memory per SM: "
    "8.0 164 KB, 8.9 100 KB, 9.0 228 KB; cross-checked in "
    "https://docs.rs/launchbound-model/2.2.0/launchbound_model/constant.DEVICES.html)"
)
_L4_DATASHEET = (
    "NVIDIA L4 datasheet, https://www.nvidia.com/en-us/data-center/l4/ (FP32 30.3 TFLOPS, "
    "FP16/BF16 tensor 242 TFLOPS with sparsity, 300 GB/s), read via "
    "https://grokipedia.com/page/NVIDIA_L4_vs_L40S and "
    "https://store.sourcecode.com/en-us/bg-bucket-compare/125/9820"
)
_L4_L2 = "AD104 L2 48 MB (TechPowerUp data via https://fpsbench.com/compare/gpu/nvidia-l4-vs-nvidia-tesla-m40)"
_ADA_WHITEPAPER = (
    "NVIDIA Ada GPU architecture whitepaper, RTX 4090 column (FP32 82.6 TFLOPS; FP16/BF16 tensor "
    "with FP32 accumulate 165.2 TFLOPS dense; 1008 GB/s; L2 72 MB), read via "
    "https://waredb.com/processor/nvidia-geforce-rtx-4090 and "
    "https://holynerdvana.blogspot.com/2022/10/nvidia-geforce-rtx-4090-specifications.html"
)
_4090_DEVICEQUERY = (
    _ADA_WHITEPAPER + "; a device query on an RTX 4090 printed 'L2 Cache Size: 72.00 MB "
    "(75497472 bytes)' (a public README, found by searching for that byte count)"
)
_T4_DATASHEET = (
    "NVIDIA T4 Tensor Core GPU datasheet (NVIDIA T4 70W low profile PCIe GPU accelerator), "
    "https://www.nvidia.com/en-us/data-center/tesla-t4/ (FP32 8.1 TFLOPS; mixed precision "
    "FP16/FP32 65 TFLOPS, no sparsity on Turing; GDDR6 320+ GB/s; 2,560 CUDA cores, 320 Turing "
    "Tensor Cores), read via https://www.tomshardware.co.uk/nvidia-tesla-t4-turing-gpu,news-"
    "59152.html and https://sysrqmts.com/en/gpus/nvidia/tesla/t4 (TechPowerUp data: 320.0 GB/s, "
    "40 SMs, L2 4 MB)"
)
_GA102_WHITEPAPER = (
    "NVIDIA Ampere GA102 GPU Architecture whitepaper, Appendix A, GeForce RTX 3090 (82 SMs; peak "
    "FP32 35.6 TFLOPS; peak FP16 Tensor TFLOPS with FP32 accumulate 71, 142 with sparsity; "
    "936 GB/s GDDR6X; L2 6144 KB; 128 KB L1/shared per SM), https://www.nvidia.com/content/PDF/"
    "nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf, read via "
    "https://docslib.org/doc/759549/nvidia-ampere-ga102-gpu-architecture-whitepaper"
)
_A10_DATASHEET = (
    "NVIDIA A10 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/products/a10-"
    "gpu/ (FP32 31.2 TFLOPS; BF16/FP16 tensor 125 TFLOPS, 250 with sparsity; 600 GB/s GDDR6; "
    "24 GB), read via https://sysrqmts.com/vi/gpus/compare/nvidia-a10-pcie-vs-nvidia-a2 "
    "(TechPowerUp data: 72 SMs, 9216 CUDA cores, L2 6 MB, 600.2 GB/s). AWS's A10G (g5 "
    "instances) has no NVIDIA datasheet; it shares the A10's 24 GB at 600 GB/s "
    "(https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/)"
)

# name -> peak numbers (SI: FLOP/s and bytes/s are powers of ten; L2 and shared memory are
# binary sizes, as cudaDeviceProp reports them) and, per number, its source.
SPECS: dict[str, dict] = {
    "A100-SXM4-80GB": {
        "fp32_flops": 19.5e12,
        "tensor16_flops": 312e12,
        "hbm_bytes_per_s": 2039e9,
        "l2_bytes": 40 * MIB,
        "smem_per_sm_bytes": 164 * KIB,
        "sms": 108,
        "arch": "sm_80",  # compute capability 8.0: what ptxas compiles for
        "sources": {
            "fp32_flops": _A100_DATASHEET,
            "tensor16_flops": _A100_DATASHEET,
            "hbm_bytes_per_s": _A100_DATASHEET + " (80GB SXM: 2,039 GB/s)",
            "l2_bytes": _A100_DEVICEQUERY,
            "smem_per_sm_bytes": _AMPERE_TUNING,
            "sms": _AMPERE_WHITEPAPER,
            "arch": _COMPUTE_CAPS,
        },
    },
    "A100-SXM4-40GB": {  # the A100 80GB's chip with 40 GB of HBM2 (DGX A100 320GB)
        "fp32_flops": 19.5e12,
        "tensor16_flops": 312e12,
        "hbm_bytes_per_s": 1555e9,
        "l2_bytes": 40 * MIB,
        "smem_per_sm_bytes": 164 * KIB,
        "sms": 108,
        "arch": "sm_80",
        "sources": {
            "fp32_flops": _A100_DATASHEET,
            "tensor16_flops": _A100_DATASHEET,
            "hbm_bytes_per_s": _A100_DATASHEET + " (40GB SXM: 1,555 GB/s)",
            "l2_bytes": _AMPERE_WHITEPAPER + " (40 MB L2, the same die as the 80GB)",
            "smem_per_sm_bytes": _AMPERE_TUNING,
            "sms": _AMPERE_WHITEPAPER,
            "arch": _COMPUTE_CAPS,
        },
    },
    "H100-SXM5-80GB": {
        "fp32_flops": 67e12,
        "tensor16_flops": 1979e12 / 2,
        "hbm_bytes_per_s": 3350e9,
        "l2_bytes": 50 * MIB,
        "smem_per_sm_bytes": 228 * KIB,
        "sms": 132,
        "arch": "sm_90",  # compute capability 9.0
        "sources": {
            "fp32_flops": _H100_DATASHEET,
            "tensor16_flops": _H100_DATASHEET + "; dense is half the sparse figure",
            "hbm_bytes_per_s": _H100_DATASHEET,
            "l2_bytes": _H100_DATASHEET + "; '50 MB' taken as 50 MiB like the A100's 40 MiB",
            "smem_per_sm_bytes": _COMPUTE_CAPS,
            "sms": _H100_DATASHEET + " (SMs: 132)",
            "arch": _COMPUTE_CAPS,
        },
    },
    "H200-SXM-141GB": {
        "fp32_flops": 67e12,
        "tensor16_flops": 1979e12 / 2,
        "hbm_bytes_per_s": 4800e9,
        "l2_bytes": 60 * MIB,
        "smem_per_sm_bytes": 228 * KIB,
        "sms": 132,
        "arch": "sm_90",  # compute capability 9.0
        "sources": {
            "fp32_flops": _H200_DATASHEET,
            "tensor16_flops": _H200_DATASHEET + "; dense is half the sparse figure",
            "hbm_bytes_per_s": _H200_DATASHEET,
            "l2_bytes": _H200_L2,
            "smem_per_sm_bytes": _COMPUTE_CAPS,
            "sms": _H200_SMS,
            "arch": _COMPUTE_CAPS,
        },
    },
    "L4": {
        "fp32_flops": 30.3e12,
        "tensor16_flops": 242e12 / 2,
        "hbm_bytes_per_s": 300e9,  # GDDR6, not HBM: the field name is the role, not the technology
        "l2_bytes": 48 * MIB,
        "smem_per_sm_bytes": 100 * KIB,
        "sms": 58,
        "arch": "sm_89",  # compute capability 8.9
        "sources": {
            "fp32_flops": _L4_DATASHEET,
            "tensor16_flops": _L4_DATASHEET + "; dense is half the sparse figure",
            "hbm_bytes_per_s": _L4_DATASHEET,
            "l2_bytes": _L4_L2 + "; taken as 48 MiB",
            "smem_per_sm_bytes": _COMPUTE_CAPS,
            "sms": _L4_SMS,
            "arch": _COMPUTE_CAPS,
        },
    },
    "RTX-4090": {
        "fp32_flops": 82.6e12,
        "tensor16_flops": 165.2e12,
        "hbm_bytes_per_s": 1008e9,  # GDDR6X
        "l2_bytes": 72 * MIB,
        "smem_per_sm_bytes": 100 * KIB,
        "sms": 128,
        "arch": "sm_89",  # compute capability 8.9
        "sources": {
            "fp32_flops": _ADA_WHITEPAPER,
            "tensor16_flops": _ADA_WHITEPAPER + " (GeForce: FP32 accumulate runs at half the "
            "FP16-accumulate rate)",
            "hbm_bytes_per_s": _ADA_WHITEPAPER,
            "l2_bytes": _4090_DEVICEQUERY,
            "smem_per_sm_bytes": _COMPUTE_CAPS,
            "sms": _ADA_WHITEPAPER + " (128 SMs)",
            "arch": _COMPUTE_CAPS,
        },
    },
    "T4": {
        "fp32_flops": 8.1e12,
        "tensor16_flops": 65e12,  # FP16 only: Turing's tensor cores have no bf16 (sm_75)
        "hbm_bytes_per_s": 320e9,  # GDDR6
        "l2_bytes": 4 * MIB,
        "smem_per_sm_bytes": 64 * KIB,
        "sms": 40,
        "arch": "sm_75",  # compute capability 7.5
        "sources": {
            "fp32_flops": _T4_DATASHEET,
            "tensor16_flops": _T4_DATASHEET + " (FP16 with FP32 accumulate, dense)",
            "hbm_bytes_per_s": _T4_DATASHEET,
            "l2_bytes": _T4_DATASHEET + "; '4 MB' taken as 4 MiB",
            "smem_per_sm_bytes": _COMPUTE_CAPS + " (7.5: 64 KB per SM)",
            "sms": _T4_DATASHEET + " (2,560 CUDA cores / 64 per Turing SM = 40)",
            "arch": _COMPUTE_CAPS,
        },
    },
    "A10": {
        "fp32_flops": 31.2e12,
        "tensor16_flops": 250e12 / 2,
        "hbm_bytes_per_s": 600e9,  # GDDR6
        "l2_bytes": 6 * MIB,
        "smem_per_sm_bytes": 100 * KIB,
        "sms": 72,
        "arch": "sm_86",  # compute capability 8.6
        "sources": {
            "fp32_flops": _A10_DATASHEET,
            "tensor16_flops": _A10_DATASHEET + "; dense is half the sparse figure",
            "hbm_bytes_per_s": _A10_DATASHEET,
            "l2_bytes": _A10_DATASHEET + "; '6 MB' taken as 6 MiB",
            "smem_per_sm_bytes": _COMPUTE_CAPS + " (8.6: 100 KB per SM)",
            "sms": _A10_DATASHEET,
            "arch": _COMPUTE_CAPS,
        },
    },
    "RTX-3090": {
        "fp32_flops": 35.6e12,
        "tensor16_flops": 71e12,  # FP32 accumulate: half the FP16-accumulate rate on GeForce
        "hbm_bytes_per_s": 936e9,  # GDDR6X
        "l2_bytes": 6 * MIB,
        "smem_per_sm_bytes": 100 * KIB,
        "sms": 82,
        "arch": "sm_86",  # compute capability 8.6
        "sources": {
            "fp32_flops": _GA102_WHITEPAPER,
            "tensor16_flops": _GA102_WHITEPAPER,
            "hbm_bytes_per_s": _GA102_WHITEPAPER,
            "l2_bytes": _GA102_WHITEPAPER + "; 6144 KB = 6 MiB",
            "smem_per_sm_bytes": _COMPUTE_CAPS + " (8.6: 100 KB per SM)",
            "sms": _GA102_WHITEPAPER,
            "arch": _COMPUTE_CAPS,
        },
    },
}

ALIASES = {
    "a100": "A100-SXM4-80GB",
    "a100-80gb": "A100-SXM4-80GB",
    "a100-40gb": "A100-SXM4-40GB",
    "h100": "H100-SXM5-80GB",
    "h200": "H200-SXM-141GB",
    "l4": "L4",
    "4090": "RTX-4090",
    "rtx4090": "RTX-4090",
    "t4": "T4",
    "a10": "A10",
    "3090": "RTX-3090",
    "rtx3090": "RTX-3090",
}
