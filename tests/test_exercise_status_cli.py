"""`python -m ckptlab exercise status --json [--check]`: every exercise's state (and verdict) as
one JSON object, for a course's grading script, run on a labs folder of its own."""

from __future__ import annotations

import json

from exercise_labs import shipped_labs
from kernel_mistakes import MISTAKES

from ckptlab import device
from ckptlab.exercises import write
from ckptlab.exercises.write import regions


def test_status_json_gives_every_exercise_its_state_and_with_check_its_verdict(tmp_path):
    folder, run = shipped_labs(tmp_path)
    ex = write.get("row_softmax")
    _, old, new, *_ = next(m for m in MISTAKES if m[0] == "row_softmax")
    solved = regions.fill(write.shipped_text(ex), (device.KERNELS_DIR / ex.kernel).read_text(),
                          "row_softmax")
    (folder / "exercises" / "row_softmax.cu").write_text(solved.replace(old, new, 1))
    (folder / "exercises" / "checkpoint.py").write_text(
        write.get("checkpoint").solution_file.read_text())
    (folder / "exercises" / "naive_ds.cu").unlink()

    out = run("status", "--json")
    assert out.returncode == 0 and not out.stderr, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)["exercises"]}
    assert list(rows) == list(write.EXERCISES)
    assert {n: r["state"] for n, r in rows.items()} == {
        n: ("attempted" if n in ("row_softmax", "checkpoint") else
            "missing" if n == "naive_ds" else "not attempted") for n in write.EXERCISES}
    assert rows["checkpoint"]["file"] == "labs/exercises/checkpoint.py"
    assert all("verdict" not in r for r in rows.values())

    out = run("status", "--json", "--check")
    assert out.returncode == 0 and not out.stderr, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)["exercises"]}
    assert rows["row_softmax"]["verdict"] == "wrong"
    assert rows["row_softmax"]["summary"].startswith("wrong: row_softmax: y is wrong")
    assert rows["checkpoint"]["verdict"] == "right"
    assert rows["naive_ds"]["verdict"] == "missing"
    assert rows["flash_forward"]["verdict"] == "not attempted"

    table = run("status")
    assert table.returncode == 0 and "row_softmax" in table.stdout and "{" not in table.stdout
