"""What to store, what to recompute: plans and the engine that runs them.

    plan.py        plans as data: block indices and checkpointed Segs; selective policies
    checkpoint.py  checkpoint(fn, *inputs) and run_plan: store a segment's input, recompute
    ledger.py      exact bytes of saved activations over time, and FLOPs by phase
    profile.py     what each stage of a chain saves and computes, measured once
    optimal.py     Revolve (binomial) and the dynamic program under a memory budget
    schedules.py   named schedules (none, sqrt, revolve(s), optimal(budget), ...) and their
                   predictions (peak bytes, recompute FLOPs) before anything runs
"""
