"""ckptlab: a lab about recomputation. Store less, recompute more.

The package is layered: a module may import modules of its own layer or of layers below it,
never above (tests/test_layout.py enforces it, and that no two modules import each other in a
cycle). From the bottom:

    cdefs, emu            constants shared with C++; the CPU emulator (runs kernels/*.cu)
    device, rng,          the target ("cuda" | "emu"), Philox, the float64 truths, the
      reference, args     command lines' argument types and one-line usage errors
    kernels               launch wrappers and the one table of tiles and limits
    measure               one launch: timers, ncu, traffic models, roofline, time model, plots
    cluster               a training step per GPU: activations at scale, step memory and
                          time, pipelines, the planner, the published runs held against
    engine                the autograd engine: Tensor, tape, ops, layers
    recompute             what to store and what to recompute: plans, checkpoint, ledger,
                          profiles, schedules
    models                MLP and GPT as chains of stages, for the labs and benchmarks
    torch                 the same on PyTorch (optional): the kernels as autograd functions,
                          the schedules on torch modules, DDP and tensor parallel
    cli, exercises        what a person runs: `python -m ckptlab ...`, the labs' checkers
"""

__version__ = "0.1.0"

# The layers, bottom first: each entry names packages or modules of ckptlab.
LAYERS = (
    ("cdefs", "emu"),
    ("device", "rng", "reference", "args"),
    ("kernels",),
    ("measure",),
    ("cluster",),
    ("engine",),
    ("recompute",),
    ("models",),
    ("torch",),
    ("cli", "exercises", "__main__"),
)
