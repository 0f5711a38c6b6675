"""A compiler run of the emulator's build has a time limit: past it the run is stopped, its own
children included, and the build raises one line that says so; the limit's setting is checked."""

from __future__ import annotations

import os
import time

import pytest

from ckptlab.emu import EmuCompileError, build


def test_a_run_past_the_limit_is_stopped_with_its_children(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "BUILD_LIMIT_S", 0.5)
    pidfile = tmp_path / "pid"
    start = time.perf_counter()
    with pytest.raises(EmuCompileError, match=r"^compiling x did not finish in 0.5 s and was "
                                              r"stopped \(") as err:
        build._run(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"], "compiling x")
    assert time.perf_counter() - start < 10 and "\n" not in str(err.value)
    pid = int(pidfile.read_text())
    for _ in range(50):  # the grandchild, killed with its group, is gone (or a zombie) soon
        try:
            os.kill(pid, 0)
            state = open(f"/proc/{pid}/stat").read().split()[2]
        except (ProcessLookupError, FileNotFoundError):
            break
        if state == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the compiler's child {pid} still runs")


@pytest.mark.parametrize("raw, seconds", [("", build.DEFAULT_BUILD_LIMIT_S), ("2.5", 2.5)])
def test_the_setting_sets_the_limit(monkeypatch, raw, seconds):
    monkeypatch.setenv("CKPTLAB_EMU_BUILD_TIMEOUT_S", raw)
    assert build.build_limit_s() == seconds


@pytest.mark.parametrize("raw", ["abc", "0", "-1", "nan"])
def test_a_bad_setting_is_one_line(monkeypatch, raw):
    monkeypatch.setenv("CKPTLAB_EMU_BUILD_TIMEOUT_S", raw)
    with pytest.raises(EmuCompileError, match="must be a number of seconds > 0"):
        build.build_limit_s()
