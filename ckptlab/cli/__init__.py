"""What a person runs: `python -m ckptlab COMMAND` (main.py dispatches).

    main.py             the dispatcher: --device, one-line usage errors (exit 2)
    tour.py             the main job: checks, store-P vs recompute over N, checkpoint schedules
    check.py            every kernel's gradients against float64
    bench_attention.py  naive, stored, flash: bytes, FLOPs, memory, time; fusion and recompute
                        gains
    bench_crossing.py   when recompute stops paying: stored / flash over d, GPU and dtype
    bench_checkpoint.py peak memory, recompute and time per schedule
    checkpoint_report.py  its rows read: the table, its notes and warnings, the figures
    hand_step.py        the checkpoint benchmark's baseline: one step written by hand in NumPy
    bench_emu.py        how fast the emulator runs
    fig2.py             the FlashAttention paper's Fig. 2 table, reproduced and corrected
    kernels_report.py   registers, shared memory and spills from NVIDIA's compiler
    report.py           what every command shares: CSV, formatting, TooBig, argument types
"""
