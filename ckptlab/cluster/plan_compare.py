"""Plans read against each other: which layouts tie with the chosen one within the model's
demonstrated error, the runner-up of another family, and why one step is shorter than another,
term by term (what `python -m ckptlab plan` and lab 14 print beside the choice)."""

from __future__ import annotations

from ckptlab.cluster import step_time
from ckptlab.cluster.planner import Option, family

# The model's demonstrated error: the median |error| of the modeled throughput on the held-out
# rows of `python -m ckptlab bench plan-check` (published runs the efficiency curve was not
# fitted on; its closing lines print it). Layouts closer than this to the fastest are a tie.
MODEL_ERROR = 0.055


def within_error(chosen: Option | None, rows: list, error: float = MODEL_ERROR) -> list:
    """The fastest option of each layout family whose step is within `error` of the chosen
    one's, fastest first (the chosen one included)."""
    if chosen is None:
        return []
    best: dict = {}
    for o in sorted((o for _, o in rows if isinstance(o, Option)), key=lambda o: o.step_s):
        best.setdefault(family(o.layout), o)
    return [o for o in best.values() if o.step_s <= chosen.step_s * (1 + error)]


def runner_up(chosen: Option | None, rows: list) -> Option | None:
    """The fastest fitting option of another layout family (t, sp, p, d, ZeRO)."""
    if chosen is None:
        return None
    others = [o for _, o in rows if isinstance(o, Option)
              and family(o.layout) != family(chosen.layout)]
    return min(others, key=lambda o: (o.step_s, o.peak), default=None)


GROUPS = {  # a step's terms as the reports name them
    "matmuls": ("matmul_f", "matmul_b"), "attention": ("attention_f", "attention_b"),
    "element-wise": ("elementwise_f", "elementwise_b"), "recompute": ("recompute",),
    "tensor-parallel comm": ("tp_f", "tp_b"), "pipeline p2p": ("p2p",),
    "bubble": ("bubble",), "data-parallel comm (exposed)": ("dp_exposed",),
    "optimizer": ("optimizer",), "offload: PCIe (exposed)": ("pcie_down", "pcie_params",
                                                          "pcie_up"),
    "offload: CPU Adam": ("cpu_adam",)}


def grouped(st: step_time.StepTime) -> dict:
    """The step's seconds by GROUPS."""
    return {g: sum(st.terms.get(k, 0.0) for k in keys) for g, keys in GROUPS.items()}


def difference(a: Option, b: Option) -> list[tuple[str, float]]:
    """(group, b's seconds - a's) for each group of the step, what b loses most first."""
    ga, gb = grouped(a.time), grouped(b.time)
    return sorted(((k, gb[k] - ga[k]) for k in ga), key=lambda kv: -kv[1])


def why_faster(a: Option, b: Option) -> str:
    """Why a's step is shorter than b's: the group b loses most on, and the one it gains most."""
    diffs = difference(a, b)
    lose, gain = diffs[0], diffs[-1]
    text = f"{lose[0]} {lose[1]:+.3g} s"
    if gain[1] < 0:
        text += f", though {gain[0]} {gain[1]:+.3g} s"
    return text
