"""Your kernels: every file in labs/exercises/ that you have started (labs/exercises/scratch/ too,
the from-scratch track) is built, run on every case of its exercise (on the emulator, race and
bounds checks on) and compared with float64. A file left as shipped is skipped as "not
attempted", with the file to fill in; a wrong one fails with the checker's diagnosis and first
hint (`python -m ckptlab exercise check NAME --hint 2` gives the second). Your code runs in a
child process of the check: an exit or a crash in it fails its test, and never ends this run."""

import pytest

from ckptlab.exercises import write


@pytest.mark.parametrize("name", [*write.EXERCISES, *write.SCRATCH])
def test_my_kernel(name):
    if write.status(name) != "attempted":
        ex = write.get(name)
        pytest.skip(f"not attempted: fill in labs/exercises/{name}{ex.learner_file.suffix} "
                    f"(lab {ex.lab}: {ex.title})")
    report = write.check(name)
    assert report.ok, "\n" + str(report)
