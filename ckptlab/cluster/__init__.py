"""A training step across a cluster, per GPU: the models behind `python -m ckptlab plan`.

The kernel-scale models (bytes, FLOPs and time of one launch) live in ckptlab.measure; this
package builds on them and is never imported by them.

    at_scale.py     Korthikanti et al.'s activation memory of a transformer layer at scale
    model_shape.py  the model (GPTShape) and the layout (Layout) a plan is asked about
    llama_layer.py  the Llama layer (LlamaShape): GQA, RoPE, SwiGLU, RMSNorm, untied output
    step_memory.py  a training step's bytes per GPU: model states by ZeRO stage and recipe,
                    activations per pipeline stage, FSDP's gathered units, the loss's buffers
    pipeline.py     layers per stage (even, or torchtitan's uneven split), 1F1B and interleaved
                    schedules: micro-batches in flight, bubble, p2p bytes
    step_time.py    a step's modeled seconds: compute, attention (measure.timemodel),
                    communication by parallelism and ZeRO stage, the bubble
    planner.py      the fastest layout that fits (what `python -m ckptlab plan` prints)
    offload.py      activations offloaded to host memory against recomputing them
    published_runs.py  the published training runs the step model is held against
    published_llama.py  torchtitan's published Llama 3 runs, held out, in its own FLOP count
"""
