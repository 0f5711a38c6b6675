"""The instruments and the models they are compared with, at the scale of one kernel launch
(the cluster-scale models of a training step are ckptlab.cluster, built on these).

    timing.py    time_fn (CUDA events or perf_counter: median and spread), peak_memory,
                 blas_threads (BLAS pools limited in-process), quartiles
    ncu.py       HBM bytes measured by Nsight Compute; the labels every byte figure carries
    traffic.py   modeled bytes and FLOPs of every kernel launch (counted == modeled, tested)
                 (traffic_tc.py: the tensor-core pair's; pair_counts.py: the (query, key) and
                 tile pairs the fused kernels visit, in closed form)
    roofline.py  GPU specs with sources, arithmetic intensity, modeled time, MFU/HFU
    occupancy.py launch shapes, registers and shared memory (ptxas), resident blocks per SM
    timemodel.py modeled time: launch cost + waves x roofline, unique/counted bounds; the
                 naive/stored/flash decomposition
    crossing.py  when recompute stops paying: the rule d < 2 R / 3, the modeled recompute gain
    published.py the papers' kernel measurements the time model is held against
    plots.py     memory / time / bytes against N, the roofline, memory traces, Pareto fronts
    tradeoff_plots.py  memory against speed (and against FLOPs), per method or schedule
    access_plots.py  who touched what: an emulator access trace (emu.trace()) as a map of each
                 argument's elements by block, one block's outlined, one thread's marked

    from ckptlab import measure
    t = measure.time_fn(step, repeats=20)      # t.median_s, t.p10_s, t.p90_s
"""

from ckptlab.measure.ncu import (
    SOURCES,
    check_source,
    measure_hbm_bytes,
    ncu_available,
    ncu_command,
    parse_ncu_csv,
)
from ckptlab.measure.timing import Timing, blas_threads, peak_memory, quartiles, time_fn

__all__ = ["SOURCES", "Timing", "blas_threads", "check_source", "measure_hbm_bytes",
           "ncu_available", "ncu_command", "parse_ncu_csv", "peak_memory", "quartiles", "time_fn"]
