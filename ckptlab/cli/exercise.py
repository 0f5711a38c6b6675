"""The kernels a learner writes: `python -m ckptlab exercise list|status|check|reset|solution`.

    exercise list                   every exercise, its lab, its file and whether it is attempted
    exercise status [--json] [--check]
                                    the same, for a script: with --json one JSON object,
                                    {"exercises": [{"name", "lab", "title", "file", "state"}, ...]}
                                    (state: "not attempted", "attempted" or "missing"); with
                                    --check each is also checked: "verdict" ("right", "wrong",
                                    "does not build", "fault", "not attempted", "missing") and
                                    "summary" (the report's first line). Exit status 0 whatever
                                    the verdicts (a course's grading script reads them)
    exercise check NAME             build labs/exercises/NAME.cu, run it on every case of the
                                    exercise (emulator: race and bounds checks on), compare with
                                    float64, say what is wrong and where; once right, its bytes
                                    beside the model's
      --hint 2                      the second, more specific hint
      --file PATH                   check another file (a copy, a GPU notebook's edit)
      --picture FILE                draw which block wrote each element of the outputs (the
                                    emulator's access trace of your kernel) and, where an output
                                    is wrong, beside it its wrong elements; FILE.png, .pdf or
                                    .svg (the format follows the suffix). A file already there
                                    is drawn over only if it is a picture ckptlab drew (it says
                                    so inside); any other is refused (exit 2), never replaced
    exercise reset NAME [--force]   the file back as shipped (--force over your work, which is
                                    kept first as NAME.cu.bak1, then .bak2, ...: every reset
                                    keeps its own copy, byte for byte; git ignores them)
    exercise solution NAME          the lines you write, as the lab's kernel has them (try first)

NAME is a guided exercise (labs/exercises/NAME.cu: the lab's kernel with its lesson's lines cut
out) or, from scratch, scratch/row_softmax, scratch/naive_ds, scratch/flash_forward or
scratch/flash_backward (labs/exercises/scratch/*.cu: the signatures, the launch and the spec in
mathematics; the bodies are yours), checked on the same cases.

Exit status of check: 0 right, 1 wrong (or does not build, or a fault), 3 not attempted;
2 for a usage error. A file that is not UTF-8 is "attempted" for list and status, "does not
build" (one line: where) for check, and reset keeps it as it is; a UTF-8 byte-order mark is
dropped before the file is built or compared.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ckptlab.args import UsageError, one_line_errors
from ckptlab.cli.report import writable_file

STATUS = {"right": 0, "not attempted": 3}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ckptlab exercise",
                                description="Kernels you write: check, reset, see solutions.")
    sub = p.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="every exercise and its state")
    st = sub.add_parser("status", help="every exercise's state, for a script (--json)")
    st.add_argument("--json", action="store_true", help="one JSON object on stdout")
    st.add_argument("--check", action="store_true", help="check each exercise too (its verdict)")
    c = sub.add_parser("check", help="build, run and check your kernel")
    c.add_argument("name")
    c.add_argument("--hint", type=int, choices=(1, 2), default=1,
                   help="which hint a wrong answer gets (2: more specific)")
    c.add_argument("--file", type=Path, help="check this file instead of labs/exercises/NAME.cu")
    c.add_argument("--picture", type=Path, metavar="FILE",
                   help="draw which block wrote each element of the outputs, and the wrong "
                        "ones (emulator); .png, .pdf or .svg")
    r = sub.add_parser("reset", help="the exercise file back as shipped")
    r.add_argument("name")
    r.add_argument("--force", action="store_true", help="replace a file with your work in it")
    s = sub.add_parser("solution", help="the lines you write, from the lab's own kernel")
    s.add_argument("name")
    return p


def main(argv=None) -> int:
    with one_line_errors():
        a = _parser().parse_args(argv)
    from ckptlab.exercises import write
    from ckptlab.exercises.write import files

    every = {**write.EXERCISES, **write.SCRATCH}
    if getattr(a, "name", None) is not None and a.name not in every:
        raise UsageError(f"exercise: no exercise {a.name!r}; one of {', '.join(every)}")
    if a.action == "list":
        print(f"{'exercise':<24}{'lab':<5}{'file':<42}state")
        for name, ex in every.items():
            print(f"{name:<24}{ex.lab:<5}{'labs/exercises/' + name + ex.learner_file.suffix:<42}"
                  f"{write.status(name)}   {ex.title}")
        return 0
    if a.action == "status":
        return _status(write, a.json, a.check)
    if a.action == "solution":
        print(write.solution(a.name))
        return 0
    if a.action == "reset":
        was = write.status(a.name)
        try:
            path = write.reset(a.name, force=a.force)
        except FileExistsError as e:
            raise UsageError(f"exercise reset: {e}".replace("reset(..., force=True)",
                                                            "--force")) from None
        kept = f" (your work is kept as {files.backups(path)[-1]})" if was == "attempted" else ""
        print(f"{path}: as shipped{kept}")
        return 0
    if a.file is not None and not a.file.is_file():
        raise UsageError(f"exercise check: --file {a.file} is not a file")
    if a.picture is not None:
        if a.name == "checkpoint":
            raise UsageError("exercise check: --picture draws a kernel's accesses; checkpoint "
                             "is Python")
        writable_file(a.picture)
        try:
            files.picture_format(a.picture)
        except ValueError as e:
            raise UsageError(f"exercise check: --picture {e}") from None
    report = write.check(a.name, file=a.file, hint=a.hint, picture=a.picture)
    print(report)
    return STATUS.get(report.status, 1)


def _status(write, as_json: bool, check: bool) -> int:
    """Every exercise's state (and, with `check`, its verdict): a table, or one JSON object."""
    rows = []
    for name, ex in write.EXERCISES.items():
        row = {"name": name, "lab": ex.lab, "title": ex.title,
               "file": f"labs/exercises/{ex.learner_file.name}", "state": write.status(name)}
        if check:
            try:
                report = write.check(name)
                row["verdict"], row["summary"] = report.status, report.lines[0]
            except Exception as e:  # one exercise's checker failing must not hide the others
                row["verdict"], row["summary"] = "error", f"{type(e).__name__}: {e}"
        rows.append(row)
    if as_json:
        print(json.dumps({"exercises": rows}, indent=1))
        return 0
    print(f"{'exercise':<18}{'lab':<5}{'state':<15}" + ("verdict" if check else ""))
    for r in rows:
        print(f"{r['name']:<18}{r['lab']:<5}{r['state']:<15}" + (r.get("summary", "")))
    return 0
