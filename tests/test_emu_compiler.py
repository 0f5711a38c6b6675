"""The C++ compiler the emulator needs, checked before it is used: GCC >= 10 on Linux. Anything
else (no g++, clang posing as g++ as on macOS, a g++ too old, a compiler that does not run,
another system) is one line naming the way out (WSL2, Docker, a Colab or Kaggle runtime), and
`python -m ckptlab` reports it as a usage error: status 2, no traceback. The compilers here are
fakes on disk that print what the real ones print."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptlab.emu import build
from ckptlab.emu.errors import CompilerUnusable, EmuCompileError

REPO = Path(__file__).resolve().parent.parent
WAY_OUT = ("WSL2", "Docker", "Colab", "Kaggle")
FAKES = {  # name -> (what --version prints, what -dumpfullversion prints, exit status)
    "clang": ("Apple clang version 15.0.0 (clang-1500.3.9.4)\nTarget: arm64-apple-darwin23.4.0",
              "15.0.0", 0),
    "gcc9": ("g++ (Ubuntu 9.4.0-1ubuntu1~20.04.2) 9.4.0", "9.4.0", 0),
    "gcc12": ("g++ (Debian 12.2.0-14+deb12u1) 12.2.0", "12.2.0", 0),
    "broken": ("", "", 1),
}


def fake(tmp_path, name) -> str:
    said, dumped, status = FAKES[name]
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\ncase \"$1\" in\n  --version) printf '%s\\n' '{said}';;\n"
                    f"  -dumpfullversion) printf '%s\\n' '{dumped}';;\nesac\nexit {status}\n")
    path.chmod(0o755)
    return str(path)


def refused(call, *words):
    with pytest.raises(CompilerUnusable) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and isinstance(info.value, EmuCompileError)
    for word in (*words, *WAY_OUT):
        assert word in message, message
    return message


@pytest.mark.parametrize("name,words", [
    ("clang", ("is not GCC", "Apple clang version 15.0.0", "on macOS g++ is clang")),
    ("gcc9", ("is GCC 9.4.0", "needs GCC >= 10")),
    ("broken", ("is not GCC",)),
])
def test_a_compiler_that_cannot_build_the_emulator_is_one_line(name, words, tmp_path):
    refused(lambda: build.check_compiler(fake(tmp_path, name)), *words)


def test_gcc_10_or_newer_on_linux_passes_and_nothing_else_does(tmp_path):
    build.check_compiler(fake(tmp_path, "gcc12"))  # no error
    build.check_compiler(build.compiler())  # this machine's real one
    for system in ("darwin", "win32", "cygwin"):
        refused(lambda s=system: build.check_compiler(fake(tmp_path, "gcc12"), platform=s),
                f"this is {system!r}", "only on Linux")
    refused(lambda: build.check_compiler(str(tmp_path / "absent")), "does not run")


def test_compiler_reads_cxx_and_checks_it(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-xyz")
    refused(build.compiler, "'no-such-compiler-xyz' is not on the PATH", "apt install g++")
    monkeypatch.setenv("CXX", fake(tmp_path, "clang"))
    refused(build.compiler, "is not GCC")
    monkeypatch.setenv("CXX", fake(tmp_path, "gcc12"))
    assert build.compiler() == str(tmp_path / "gcc12")


def test_the_command_line_says_it_in_one_line_with_status_2(tmp_path):
    """As a learner on a Mac meets it: g++ is clang; a fresh cache, so nothing was built."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "CXX": fake(tmp_path, "clang"),
           "CKPTLAB_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, "-m", "ckptlab", "check", "--quick"], capture_output=True,
                       text=True, env=env, timeout=120, cwd=tmp_path)
    lines = [x for x in p.stderr.replace("\r", "\n").splitlines() if x.startswith("error:")]
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert len(lines) == 1 and "is not GCC" in lines[0] and "WSL2" in lines[0], p.stderr


def test_the_dockerfile_runs_the_readmes_two_commands_as_written():
    """The way out the messages name: the Dockerfile at the root runs the README's two commands
    word for word, in an image with the g++ and binutils the emulator needs."""
    readme = (REPO / "README.md").read_text()
    block = readme.split("```sh\n", 1)[1].split("```", 1)[0].strip().splitlines()
    docker = (REPO / "Dockerfile").read_text()
    runs = [line.removeprefix("RUN ") for line in docker.splitlines() if line.startswith("RUN ")]
    assert len(block) == 2 and runs[-2:] == block, (block, runs)
    assert "apt-get install -y --no-install-recommends g++ binutils" in docker
    assert docker.startswith("#") and "FROM python:3.11" in docker
