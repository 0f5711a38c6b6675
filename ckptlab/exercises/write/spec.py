"""What an exercise that a learner writes is made of: the kernel file it is cut from, its steps,
the cases it is checked on, its outputs and the hints for each way they go wrong.

A case changes one thing from the exercise's first case, "base" (a tail tile, the causal mask,
Nq != Nk, a head dim below the tile...), so that which cases fail says what the kernel gets
wrong: the checker's first clue, before it looks at the elements.

The learner's file is compiled into more than one kernel when it is a template (the stored
method beside flash, the deterministic dQ beside the atomic one, tf32 beside the 16-bit types):
each such instantiation is a Variant, and the cases run through it follow the default's, the
base case labelled with the variant's name ("stored") and any other "variant+case"
("stored+tail"), so that the first case that fails still names the one thing that differs from
a case that passed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

LABS_DIR = Path(os.environ.get("CKPTLAB_LABS",
                               Path(__file__).resolve().parents[3] / "labs"))
EXERCISE_DIR = LABS_DIR / "exercises"

# fp32 against float64 on these sizes (sums of at most a few hundred terms): relative errors of
# 1e-7 to 1e-6 of an output's largest magnitude (the lab's own kernels: tests/test_attention.py).
# 1e-4 leaves a 100x margin for another order of summation, and a bug that changes one element
# by more than 1/10,000 of the largest still shows.
RTOL = 1e-4


@dataclass(frozen=True)
class Case:
    """One launch configuration. `label` names the one thing changed from "base" (which is
    base itself for the first case); `phrase` says it in words for the messages."""

    label: str
    phrase: str
    sizes: dict
    options: dict = field(default_factory=dict)
    seed: int = 0
    variant: str = ""  # the Variant it runs through ("": the file's default instantiation)

    def describe(self) -> str:
        s = ", ".join(f"{k}={v}" for k, v in self.sizes.items())
        o = ", ".join(f"{k}={v}" for k, v in self.options.items() if v not in (False, 0, 0.0))
        return s + (f", {o}" if o else "")


@dataclass(frozen=True)
class Variant:
    """An instantiation of the learner's file other than the default one: `options` select it
    (what the run function reads), `cases` the labels of the cases run through it (every case
    when empty)."""

    label: str
    phrase: str
    options: dict
    cases: tuple = ()


def with_variants(cases: tuple, variants: tuple) -> tuple:
    """`cases` (the default instantiation's, "base" first), then each variant's: "base" under
    variant v is labelled v.label and says v.phrase, another case c is "v.label+c.label" and
    says c's phrase "in the v.label instantiation"."""
    out = list(cases)
    for v in variants:
        for c in cases:
            if v.cases and c.label not in v.cases:
                continue
            label = v.label if c.label == cases[0].label else f"{v.label}+{c.label}"
            phrase = (v.phrase if c.label == cases[0].label
                      else f"{c.phrase}, in the {v.label} instantiation")
            out.append(Case(label, phrase, c.sizes, {**c.options, **v.options}, c.seed,
                            v.label))
    return tuple(out)


@dataclass(frozen=True)
class Output:
    """An array the check compares, with the name of each axis and the tile size along it
    (for saying where it is wrong: "only in the last, partial tile of rows i")."""

    name: str
    axes: tuple
    tiles: dict = field(default_factory=dict)


@dataclass(frozen=True)
class StepText:
    """What the learner's file says in place of a step: notes (comment lines) and a placeholder
    that keeps the file compiling (declarations the given code after it uses)."""

    notes: tuple = ()
    placeholder: tuple = ()


@dataclass
class Exercise:
    name: str
    lab: str
    title: str
    kernel: str                  # the kernels/ file the exercise is cut from: its solution
    steps: dict                  # step number -> StepText
    outputs: tuple               # Output, in the order they are diagnosed
    cases: tuple                 # Case, "base" first
    inputs: Callable             # case -> dict of NumPy arrays (fixed seed per case)
    run: Callable                # (case, inputs) -> dict of outputs, through the lab's wrappers
    truth: Callable              # (case, inputs) -> dict of float64 outputs
    traffic: Callable | None = None  # case -> the model's per-launch traffic of the kernels
    kernels: tuple = ()          # the kernel names (in the learner's file) whose bytes count
    hints: dict = field(default_factory=dict)  # pattern or (output, pattern) -> (hint 1, 2)
    intro: tuple = ()            # lines for the learner file's header, after the title
    # what a wrong output may equal instead: pattern -> (what it is, (case, inputs) -> dict of
    # float64 outputs, or None where that slip changes nothing in the case)
    alternatives: dict = field(default_factory=dict)
    # the picture of who touched what (`check --picture`): the launch (a kernel name, or its
    # name before '<') and the output arguments whose writers are drawn
    picture: tuple = ()
    rtol: float = RTOL

    @property
    def learner_file(self) -> Path:
        return EXERCISE_DIR / f"{self.name}.cu"


def fixed_normal(seed: int, *shapes, dtype=np.float32):
    """Standard normal arrays of `shapes`, the same for every run of a case."""
    g = np.random.default_rng(seed)
    return tuple(g.standard_normal(s, dtype=dtype) for s in shapes)
