"""Every bad invocation ends in one line on stderr and exit status 2, never a traceback, and is
refused before any work: the work functions of each command are replaced by one that fails the
test if it is reached. Paths in the cases: {file} is an existing file, {missing} a folder that
does not exist, {out} a fresh output folder."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ckptlab.cli import bench_attention, bench_checkpoint, bench_emu, check, fig2, tour
from ckptlab.cli import main as cli

REPO = Path(__file__).resolve().parent.parent
CK = ["bench", "checkpoint", "--layers", "2", "--width", "8", "--batch", "4", "--no-torch",
      "--repeats", "1"]

CASES = [  # (argv, a part of the message)
    (["bench", "attention", "--n", "64,128", "--csv", "{missing}/x.csv"], "does not exist"),
    (["bench", "attention", "--n", "64,128", "--png", "{file}"], "exists and is not a folder"),
    (["bench", "attention", "--png", "{file}/x"], "cannot create it"),
    ([*CK, "--schedule", "none", "--csv", "{missing}/x.csv"], "does not exist"),
    (["bench", "emu", "--csv", "{missing}/x.csv"], "does not exist"),
    (["check", "--quick", "--csv", "{missing}/x.csv"], "does not exist"),
    (["check", "--quick", "--csv", "{dir}"], "is a folder"),
    (["tour", "--quick", "--out", "{file}"], "exists and is not a folder"),
    (["fig2", "--out", "{file}"], "exists and is not a folder"),
    (["tour", "--quick", "--out", "{file}/sub"], "cannot create it"),
    (["fig2", "--out", "{file}/sub"], "cannot create it"),
    (["bench", "checkpoint", "--model", "gpt", "--heads", "0"], "expected an integer >= 1"),
    (["bench", "attention", "--heads", "0"], "expected an integer >= 1"),
    (["tour", "--heads", "0"], "expected an integer >= 1"),
    (["bench", "emu", "--size", "0"], "expected an integer >= 1"),
    (["bench", "emu", "--flash-n", "-1"], "expected an integer >= 0"),
    (["fig2", "--repeats", "-1"], "expected an integer >= 1"),
    (["bench", "checkpoint", "--batch", "0"], "expected an integer >= 1"),
    (["bench", "checkpoint", "--schedule", ""], "expected comma-separated schedules"),
    (["bench", "checkpoint", "--schedule", "none,,sqrt"], "expected comma-separated schedules"),
    (["bench", "checkpoint", "--dropout", "1.5"], r"--dropout must be in \[0, 1\)"),
    (["bench", "checkpoint", "--model", "gpt", "--width", "10", "--heads", "3"], "divisible"),
    (["bench", "attention", "--batch", "70000"], r"B \* H = 70000 is over the 65535"),
    (["tour", "--batch", "70000", "--out", "{out}"], r"B \* H = 70000"),
    (["bench", "checkpoint", "--batch", "70000", "--width", "4096"], r"needs ~\d+\.\d+ GB"),
    (["tour", "--n", "64,99999999", "--out", "{out}"], "needs ~"),
    (["kernels", "nosuch.cu"], "'nosuch.cu' is not a kernel of .*kernels: expected one of"),
    (["kernels", "/etc/passwd"], "'/etc/passwd' is not a kernel of .*attn_flash_bwd.cu, "),
    (["kernels", "common.cuh"], "'common.cuh' is not a kernel of"),
    (["kernels", "../pyproject.toml"], "'../pyproject.toml' is not a kernel of"),
    (["kernels", "{file}"], "is not a kernel of"),
    (["kernels", "--arch", "sm_xx"], "expected one of .*sm_75"),
    (["bench", "nosuch"], "expected one of attention, checkpoint, emu"),
]


def forbid_work(monkeypatch):
    """Each command's work, replaced by a failure: a refusal must come before it."""
    def work(*args, **kwargs):
        raise AssertionError("work started before the arguments were checked")

    for module, name in ((bench_attention, "run_case"), (bench_checkpoint, "run"),
                         (bench_emu, "run"), (check, "run"), (fig2, "run"),
                         (tour, "part_checks")):
        monkeypatch.setattr(module, name, work)


@pytest.mark.parametrize("argv,message", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_a_bad_invocation_is_one_line_and_exit_2_before_any_work(argv, message, tmp_path,
                                                                 monkeypatch, capsys):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    out = tmp_path / "out"
    paths = {"file": str(afile), "missing": str(tmp_path / "missing"), "out": str(out),
             "dir": str(tmp_path)}
    forbid_work(monkeypatch)
    rc = cli.main([a.format(**paths) for a in argv])
    got, err = capsys.readouterr()
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert "Traceback" not in err and got == ""
    assert re.search(message, err), err
    assert not (tmp_path / "missing").exists()  # nothing was created on the way
    assert not out.exists() or list(out.iterdir()) == []  # tour_checks.csv not written


def test_a_schedule_that_is_no_schedule_is_one_line(capsys):
    """'optimal(inf)' is refused once the profile it is relative to exists (an OverflowError
    before); the rest of the run never starts."""
    for spec in ("optimal(inf)", "optimal(nan)", "optimal(-1%)", "bogus"):
        rc = cli.main([*CK, "--schedule", f"none,{spec}"])
        _, err = capsys.readouterr()
        assert rc == 2 and len(err.strip().splitlines()) == 1, err


def test_bench_help_is_help(capsys):
    for argv in (["bench", "--help"], ["bench", "-h"]):
        rc = cli.main(argv)
        out, err = capsys.readouterr()
        assert rc == 0 and err == ""
        for name in ("attention", "checkpoint", "emu"):
            assert f"bench {name}" in out


@pytest.mark.parametrize("env,message", [
    ({"CKPTLAB_EMU_STACK_KIB": "abc"}, "CKPTLAB_EMU_STACK_KIB='abc': expected an integer"),
    ({"CKPTLAB_EMU_STACK_KIB": "2"}, "stack_kib must be in"),
    ({"CKPTLAB_EMU_WATCHDOG_S": "-1"}, "watchdog_s must be > 0"),
    ({"CKPTLAB_EMU_WATCHDOG_S": "soon"}, "expected a number"),
    ({"CKPTLAB_EMU_MODE": "slow"}, "mode must be 'counted' or 'fast'"),
    ({"CKPTLAB_EMU_RACE_CHECK": "maybe"}, "CKPTLAB_EMU_RACE_CHECK='maybe'"),
    ({"CKPTLAB_KERNELS": "/nonexistent"}, "CKPTLAB_KERNELS='/nonexistent' is not a folder"),
    ({"CKPTLAB_DEVICE": "tpu"}, "unknown target 'tpu'"),
])
def test_a_bad_environment_is_one_line_in_a_new_process(env, message, tmp_path):
    """As a user meets it: the emulator reads CKPTLAB_EMU_* when it is imported, so this runs
    `python -m ckptlab check --quick --csv ...` in a new process."""
    full = {**os.environ, "PYTHONPATH": str(REPO), **env}
    csv = tmp_path / "c.csv"
    p = subprocess.run([sys.executable, "-m", "ckptlab", "check", "--quick", "--csv", str(csv)],
                       capture_output=True, text=True, env=full, timeout=120, cwd=tmp_path)
    assert p.returncode == 2, p.stderr[-2000:]
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr
    assert message in p.stderr and p.stdout == "" and not csv.exists()
