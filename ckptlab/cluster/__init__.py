"""A training step across a cluster, per GPU: the models behind `python -m ckptlab plan`.

The kernel-scale models (bytes, FLOPs and time of one launch) live in ckptlab.measure; this
package builds on them and is never imported by them.

    at_scale.py     Korthikanti et al.'s activation memory of a transformer layer at scale
    model_shape.py  the model (GPTShape) and the layout (Layout) a plan is asked about
    gpt_layer.py    GPT's layer: parameters, FLOPs and saved bytes, term by term
    llama_layer.py  the Llama layer (LlamaShape): GQA, RoPE, SwiGLU, RMSNorm, untied output
    step_memory.py  a training step's bytes per GPU: model states by ZeRO stage and recipe,
                    activations per pipeline stage, FSDP's gathered units, the loss's buffers
    zero3.py        ZeRO-3 as each implementation runs it: PyTorch FSDP's units, DeepSpeed's
                    buckets and prefetch; the gathers' overlap with compute
    zero_offload.py model states in host memory: ZeRO-Offload's optimizer, ZeRO-Infinity's
                    streamed parameters, their PCIe transfers and the CPU's Adam step
    pipeline.py     layers per stage (even, or torchtitan's uneven split), 1F1B and interleaved
                    schedules: micro-batches in flight, bubble, p2p bytes
    links.py        NVLink inside a node, the node's NICs shared by its GPUs, each at its
                    measured rate; hierarchical data-parallel collectives
    efficiency.py   the fraction of the peak a step's matmuls reach, by GEMM width (fitted on
                    named calibration rows)
    step_time.py    a step's modeled seconds: compute, attention (measure.timemodel),
                    communication by parallelism and ZeRO stage, the bubble
    planner.py      the fastest layout that fits (what `python -m ckptlab plan` prints)
    plan_compare.py ties within the model's demonstrated error, the runner-up, why faster
    offload.py      activations offloaded to host memory against recomputing them
    published_runs.py  the published training runs the step model is held against
    fsdp_runs.py    llm-foundry's published PyTorch FSDP runs, held out
    published_llama.py  torchtitan's published Llama 3 runs, held out, in its own FLOP count
"""
