"""A labs folder of its own for the exercise command's tests: every learner file as shipped and
the checkpoint solution (its shipped file is cut from it), read by `python -m ckptlab exercise`
through CKPTLAB_LABS."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from ckptlab.exercises import write


def shipped_labs(folder):
    """Fill `folder` as labs/ is shipped; (folder, run), run(*args) running
    `python -m ckptlab exercise *args` on it (a CompletedProcess, text)."""
    (folder / "exercises").mkdir()
    (folder / "solutions").mkdir()
    shutil.copyfile(write.get("checkpoint").solution_file, folder / "solutions" / "checkpoint.py")
    for ex in write.EXERCISES.values():
        (folder / "exercises" / ex.learner_file.name).write_text(write.shipped_text(ex))

    def run(*args):
        return subprocess.run([sys.executable, "-m", "ckptlab", "exercise", *args],
                              capture_output=True, text=True, cwd=folder,
                              env={**os.environ, "CKPTLAB_LABS": str(folder)})
    return folder, run
