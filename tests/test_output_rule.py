"""One rule for every command's output (ckptlab.args): an output path that cannot be written is
one line and status 2 before any work (as root too: /proc passes os.access); a write error once
the work ran (a full disk, here /dev/full behind a symlink) is one line and status 1; a closed
stdout (`| head`) ends quietly with status 1. In this process for every command, then once as
a user runs it: `python -m ckptlab` into a closed pipe and into a full disk, and the entry of
every script (`python -m ckptlab.torch.demo`, bench/*.py) under the same rule."""

import ast
import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ckptlab import args
from ckptlab.cli import (
    bench_attention,
    bench_checkpoint,
    bench_crossing,
    bench_emu,
    bench_torch,
    check,
    fig2,
    tour,
)
from ckptlab.cli import main as cli

REPO = Path(__file__).resolve().parent.parent
CK = ["bench", "checkpoint", "--layers", "2", "--width", "8", "--batch", "4", "--no-torch",
      "--repeats", "1", "--schedule", "none,sqrt"]
FILES = {  # a command -> its argv with {} for an output file
    "check --csv": ["check", "--quick", "--csv", "{}"],
    "bench attention --csv": ["bench", "attention", "--n", "64", "--impl", "flash", "--csv", "{}"],
    "bench checkpoint --csv": [*CK, "--csv", "{}"],
    "bench emu --csv": ["bench", "emu", "--size", "16", "--repeats", "1", "--flash-n", "0",
                        "--workers", "1", "--csv", "{}"],
    "bench crossing --csv": ["bench", "crossing", "--d", "64", "--gpus", "A100", "--csv", "{}"],
    "bench torch --csv": ["bench", "torch", "--layers", "1", "--width", "32", "--heads", "2",
                          "--seq", "16", "--batch", "2", "--repeats", "1", "--attn", "flash",
                          "--csv", "{}"],
}
FOLDERS = {  # a command -> its argv with {} for an output folder, and a file it writes there
    "tour --out": (["tour", "--quick", "--out", "{}"], "tour_checks.csv"),
    "fig2 --out": (["fig2", "--out", "{}"], "fig2.csv"),
    "bench checkpoint --png": ([*CK, "--png", "{}"], "checkpoint_memory_vs_time.png"),
    "bench attention --png": (["bench", "attention", "--n", "64", "--impl", "flash", "--png",
                               "{}"], "attention_memory_vs_speed.png"),
}
SLOW = {"fig2 --out"}  # ~12 s of modeled work before its one write
TORCH = {"bench torch --csv"}
LONG = "/" + "a" * 300  # longer than a file name may be (ENAMETOOLONG)


def marks(name):
    return ([pytest.mark.slow] if name in SLOW else []) + \
        ([pytest.mark.torch] if name in TORCH else [])


def cases(table, values):
    return [pytest.param(name, v, id=f"{name} {v[:20]!r}", marks=marks(name))
            for name in table for v in values]


def forbid_work(monkeypatch):
    def work(*a, **k):
        raise AssertionError("work started before the output path was checked")

    for module, name in ((bench_attention, "sweep"), (bench_checkpoint, "run"), (bench_emu, "run"),
                         (bench_torch, "run"), (check, "run"), (fig2, "run"),
                         (tour, "part_checks"), (bench_crossing.crossing, "recompute_gains")):
        monkeypatch.setattr(module, name, work)


def messages(err: str) -> list[str]:
    """stderr's lines, less tqdm's progress bars (redrawn in place: '25%|...')."""
    return [x for x in re.split(r"[\r\n]", err) if x.strip() and not re.search(r"\d+%\|", x)]


def one_line(capsys, rc, status, message):
    """Status `rc`, and on stderr one line with `message` (besides progress bars)."""
    out, err = capsys.readouterr()
    assert rc == status, err
    lines = messages(err)
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
    return out


@pytest.mark.parametrize("name,path", cases(FILES, ["/proc/x.csv", "{file}/x.csv", "", LONG]))
def test_an_output_file_that_cannot_be_written_is_refused_before_any_work(
        name, path, tmp_path, monkeypatch, capsys, request):
    if name in TORCH:
        request.getfixturevalue("torch")
    afile = tmp_path / "afile"
    afile.write_text("x")
    forbid_work(monkeypatch)
    argv = [a.replace("{}", path.replace("{file}", str(afile))) for a in FILES[name]]
    one_line(capsys, cli.main(argv), 2, "")


@pytest.mark.parametrize("name,path", cases(FOLDERS, ["/proc", "/proc/x", "{file}", "", LONG]))
def test_an_output_folder_that_cannot_be_written_is_refused_before_any_work(
        name, path, tmp_path, monkeypatch, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    forbid_work(monkeypatch)
    argv = [a.replace("{}", path.replace("{file}", str(afile))) for a in FOLDERS[name][0]]
    one_line(capsys, cli.main(argv), 2, "")


def test_bench_attentions_png_folder_is_checked_before_any_work(tmp_path, monkeypatch, capsys):
    """--png DIR: a file where the folder should be is refused first, and so is '-' (stdout
    is no place for a figure)."""
    forbid_work(monkeypatch)
    (tmp_path / "a_file").write_text("")
    base = ["bench", "attention", "--n", "64", "--png"]
    one_line(capsys, cli.main([*base, str(tmp_path / "a_file")]), 2, "")
    one_line(capsys, cli.main([*base, "-"]), 2, "")


FULL = [pytest.param(name, id=name, marks=marks(name)) for name in [*FILES, *FOLDERS]]


@pytest.mark.parametrize("name", FULL)
def test_a_write_error_after_the_work_is_one_line_and_status_1(name, tmp_path, capsys, request):
    """The output is a symlink to /dev/full (every write fails: ENOSPC); the path check passes,
    the work runs, the write fails: one line naming the file, status 1, no traceback."""
    if name in TORCH:
        request.getfixturevalue("torch")
    if name in FILES:
        target = tmp_path / ("out.png" if "--png" in name else "out.csv")
        argv = [a.replace("{}", str(target)) for a in FILES[name]]
    else:
        argv_, written = FOLDERS[name]
        target = tmp_path / "out" / written
        target.parent.mkdir()
        argv = [a.replace("{}", str(target.parent)) for a in argv_]
    target.symlink_to("/dev/full")
    one_line(capsys, cli.main(argv), 1, f"error: {target}: No space left on device")


class ClosedStdout:
    """A stdout whose reader has gone (`| head` after its lines): every write and flush fails."""

    def __init__(self, error: OSError | None = None):
        self.error = error or BrokenPipeError(errno.EPIPE, "Broken pipe")

    def write(self, text):
        raise self.error

    def flush(self):
        raise self.error


PIPED = {**{n: argv for n, argv in FILES.items() if "--csv" in n},
         "tour": FOLDERS["tour --out"][0], "fig2": FOLDERS["fig2 --out"][0],
         "kernels": ["kernels", "sgemm_tiled.cu", "--arch", "sm_80"],
         "kernels --support": ["kernels", "--support"],
         "bench model-check": ["bench", "model-check"],
         "plan": ["plan", "--model", "gpt2-small", "--memory-gb", "24"],
         "help": ["--help"]}
SLOW.add("fig2")


@pytest.mark.parametrize("name", [pytest.param(n, id=n, marks=marks(n)) for n in PIPED])
def test_a_closed_stdout_ends_quietly(name, tmp_path, monkeypatch, capsys, request):
    """Every command printing into a pipe whose reader has stopped: status 1, nothing on
    stderr (no BrokenPipeError traceback); stdout's CSV ('-') too."""
    if name in TORCH:
        request.getfixturevalue("torch")
    argv = [a.replace("{}", "-" if "csv" in name else str(tmp_path / "o")) for a in PIPED[name]]
    monkeypatch.setattr(sys, "stdout", ClosedStdout())
    rc = cli.main(argv)
    err = capsys.readouterr().err
    assert rc == 1, err
    if "-" in argv:  # the table goes to stderr when the CSV takes stdout
        assert "Traceback" not in err and "error:" not in err, err
    else:
        assert messages(err) == [], err


def test_a_full_stdout_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", ClosedStdout(OSError(errno.ENOSPC, os.strerror(28))))
    rc = cli.main(["bench", "crossing", "--d", "64", "--gpus", "A100"])
    assert rc == 1 and capsys.readouterr().err == "error: No space left on device\n"


# ---------------------------------------------------------------- as a user runs them


def run(argv, stdout, **kw):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, *argv], stdout=stdout, stderr=subprocess.PIPE,
                          text=True, env=env, timeout=120, cwd=REPO, **kw)


def test_python_m_ckptlab_into_a_closed_pipe_and_a_full_disk():
    """The interpreter's own last flush at exit must not print "Exception ignored ...
    BrokenPipeError" either: only a real process shows that."""
    argv = ["-m", "ckptlab", "bench", "crossing", "--d", "64", "--gpus", "A100,H200"]
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte
    try:
        p = run(argv, write)
    finally:
        os.close(write)
    assert (p.returncode, p.stderr) == (1, "")
    with open("/dev/full", "w") as full:
        p = run(argv, full)
    assert p.returncode == 1 and p.stderr == "error: No space left on device\n"


ENTRIES = [REPO / "ckptlab" / "__main__.py", REPO / "ckptlab" / "torch" / "demo.py",
           *sorted((REPO / "bench").glob("*.py"))]


@pytest.mark.parametrize("path", ENTRIES, ids=[p.name for p in ENTRIES])
def test_every_script_enters_through_the_rule(path):
    """Each `if __name__ == "__main__":` ends the process with exit_with(main)."""
    tree = ast.parse(path.read_text())
    mains = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    assert len(mains) == 1, path
    assert ast.unparse(mains[0].body[-1]) == "exit_with(main)", path


def test_exit_with_keeps_the_status_and_ends_quietly(monkeypatch, capsys):
    """exit_with(main), as a script ends: main's status; a usage error one line and 2; a
    closed stdout status 1 and silent; a stdout that cannot be flushed one line and 1."""
    monkeypatch.setattr(sys, "argv", ["script.py", "--n", "3"])

    def ending(main):
        with pytest.raises(SystemExit) as info:
            args.exit_with(main)
        return info.value.code

    assert ending(lambda argv: 0 if argv == ["--n", "3"] else 5) == 0
    assert ending(lambda argv: 3) == 3

    def bad(argv):
        raise args.UsageError("script.py: --n 3: too many")

    assert ending(bad) == 2
    assert capsys.readouterr().err == "error: script.py: --n 3: too many\n"
    monkeypatch.setattr(sys, "stdout", ClosedStdout())
    assert ending(lambda argv: print("a line") or 0) == 1
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(sys, "stdout", ClosedStdout(OSError(errno.ENOSPC, os.strerror(28))))
    assert ending(lambda argv: 0) == 1
    assert capsys.readouterr().err == "error: No space left on device\n"


def test_the_gpu_scripts_check_their_folder_first(monkeypatch, capsys):
    """bench/gpu_peer.py and bench/gpu_ncu.py --out: a folder nobody can create is one line
    and status 2, before any GPU or emulator work."""
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import gpu_ncu
    import gpu_peer

    def work(*a, **k):
        raise AssertionError("work started before --out was checked")

    monkeypatch.setattr(gpu_peer, "run", work)
    monkeypatch.setattr(gpu_ncu, "profile", work)
    for main in (gpu_peer.main, gpu_ncu.main):
        rc = args.run_command(main, ["--out", "/proc/ckptlab-out"])
        one_line(capsys, rc, 2, "--out /proc/ckptlab-out: cannot create it")
