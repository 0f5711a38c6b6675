"""What a second look at a failing kernel shows, beyond its outputs' elements.

- A local read before it is set: the failing case is run again with every local variable
  starting as 0 instead of the check's poison (emu.build.ZERO_LOCALS against POISON_LOCALS).
  A kernel that reads no local before writing it gives the same outputs both ways; one that
  does gives others, whatever the poison became on the way (0, NaN, a huge number).
- A race between blocks that is a head's offset: the element raced on lies in another head's
  part of the output than the head of the block that wrote it.
- Outputs right and wrong together: which outputs are right narrows where the error is (dV
  right in the backward: P is right, the error is in dS).
"""

from __future__ import annotations

import re

import numpy as np

from ckptlab import device, emu
from ckptlab.emu.build import POISON_FLOAT
from ckptlab.exercises.write.diagnose import Finding, example, mismatch, same


def uninitialised_local(ex, text: str, shown: str, failure, arrays: dict, rtol: float):
    """The Finding "uninit" when the failing case's outputs change with every local starting
    at 0 (the emulator only), else None. `arrays`: the outputs of that case under the poison."""
    if device.target() != "emu":
        return None
    case, inputs = failure.case, ex.inputs(failure.case)
    try:
        with device.kernel_file(ex.kernel, text, name=shown, poison_locals="zero"):
            out = ex.run(case, inputs)
    except emu.EmuError:
        return None
    again = {o.name: np.asarray(device.to_numpy(out[o.name]), np.float64) for o in ex.outputs
             if o.name in out and o.name in arrays}  # S: the stored instantiation's only
    changed = [n for n, x in again.items()
               if not same(x, np.asarray(arrays[n], np.float64), 0.0)]
    if not changed:
        return None
    truth = ex.truth(case, inputs)
    right = all(not mismatch(x, np.asarray(truth[n], np.float64), rtol).any()
                for n, x in again.items())
    name = failure.output.name if failure.output.name in changed else changed[0]
    where = (f"{name} changes in case {case.label} when the kernel's local variables start as "
             f"0 instead of the check's poison ({POISON_FLOAT:.3g}): a local variable is read "
             "before its first write" + ("; with every local starting at 0 every output would "
                                         "be right, so it is an accumulator never set to 0"
                                         if right else ""))
    return Finding(name, "uninit", where, example(failure) if failure.output.name == name
                   else f"{name} differs from the run with locals at 0", case, rank=5)


RACE = re.compile(r"byte \+(\d+) of argument '(\w+)'")


def race_in_another_head(ex, case, inputs, err):
    """(pattern "race_heads", a sentence) when a race between blocks is on an element of an output
    whose head is not the head of the block that wrote it (blockIdx.y runs over the heads in
    the attention exercises), else None."""
    m, block = RACE.search(str(err)), getattr(err, "block", None)
    out = next((o for o in ex.outputs if m and o.name == m[2]), None)
    if out is None or block is None or not ({"b", "h"} <= set(out.axes) or "bh" in out.axes):
        return None
    shape = np.shape(ex.truth(case, inputs)[out.name])
    lead = 2 if {"b", "h"} <= set(out.axes) else 1
    per = int(np.prod(shape[lead:]))
    element = int(m[1]) // 4
    head, writer = element // per, int(block[1])
    if head == writer:
        return None
    return "race_heads", (f"the race is between heads: a block of head {writer} (blockIdx.y = "
                     f"{writer}) wrote element {element} of {out.name}, which lies in head "
                     f"{head}'s part ({per} elements a head): where in {out.name} does a "
                     "head's part begin?")


# exercise -> (outputs right, outputs wrong, pattern, sentence) in the case a finding is about
IMPLIED = {
    "flash_backward": [({"dV"}, {"dQ", "dK"}, "ds_only",
                        "dV is right, so P is right; dQ and dK are wrong, so the error is in "
                        "what they share and dV does not: dS = P (dP - D), its dP (which rows "
                        "of which tiles meet) or its D")],
    "flash_forward": [({"L"}, {"O"}, "o_only",
                       "L is right, so the row's max and sum are right; O is wrong, so the "
                       "error is in what O accumulates (P V and its rescale) or in how it is "
                       "divided")],
}


def implied(ex, main: Finding, results: dict) -> Finding | None:
    """A Finding from which outputs are right beside the wrong ones in the case of `main`
    (results: case label -> output name -> 'ok' or an error), where the exercise knows what
    that says, else None."""
    cells = results.get(main.case.label, {})
    for right, wrong, pattern, sentence in IMPLIED.get(ex.name, []):
        if all(cells.get(n) == "ok" for n in right) and all(
                cells.get(n, "ok") != "ok" for n in wrong):
            name = next(o.name for o in ex.outputs if o.name in wrong)
            return Finding(name, pattern, f"{main.where.rstrip('.')}. {sentence}",
                           main.example if main.output == name else "", main.case, rank=4)
    return None
