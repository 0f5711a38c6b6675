"""bench/gpu_check.sh on a machine without a GPU: the dry run's plan (every step's exact command
and limit, the budget, the packing of $OUT for the device tool), the real run stopping cleanly
when there is no GPU, and the step and packing functions of bench/gpu_lib.sh driven one by one."""

import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu_check.sh"
LIB = ROOT / "bench" / "gpu_lib.sh"
BUDGET_S, CALL_S = 520, 600  # the script's budget; the device tool's longest call
STEPS = ["env", "pytest_gpu", "peer", "ncu_bytes", "bench_attention", "tour", "fig2", "crossing"]
STEP_LINE = re.compile(r"^== (\w+) \(limit (\d+) s\): (.+)$")


def check_script(*args, env_extra=None, timeout=120):
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "HOME": str(Path.home()),
           **(env_extra or {})}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd="/")


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("dry")
    out, results = base / "OUT", base / "results"
    out.mkdir()
    p = check_script("--dry-run", str(results), env_extra={"OUT": str(out)})
    steps = [m.groups() for m in map(STEP_LINE.match, p.stdout.splitlines()) if m]
    return p, out, results, steps


def test_dry_run_lists_every_step_with_its_limit(dry_run):
    p, _, _, steps = dry_run
    assert p.returncode == 0, p.stdout + p.stderr
    assert [s[0] for s in steps] == STEPS
    # the budget, added up here from the printed limits (the script's 5 s grace per step and
    # 15 s of packing included), fits with room for the device call's start-up and transfers
    total = sum(int(s[1]) for s in steps) + 5 * len(steps) + 15
    assert total <= BUDGET_S < CALL_S
    assert f"= {total} s of {BUDGET_S} s: fits" in p.stdout


def test_dry_run_commands_are_the_ones_that_would_run(dry_run):
    _, _, results, steps = dry_run
    cmd = {name: c for name, _, c in steps}
    py = sys.executable
    assert all(c.startswith(py + " ") for c in cmd.values())
    for name, script in (("env", "bench/gpu_env.py"), ("peer", "bench/gpu_peer.py"),
                         ("ncu_bytes", "bench/gpu_ncu.py")):
        assert cmd[name].split()[1] == script and (ROOT / script).is_file()
    for name in ("bench_attention", "tour", "fig2"):
        assert f"-m ckptlab --device cuda {name.replace('_', ' ')}" in cmd[name]
    assert f"--out {results}/peer" in cmd["peer"] and f"--out {results}/ncu" in cmd["ncu_bytes"]
    # the ncu run has its own time limit, inside the step's
    ncu_limit = dict((n, int(s)) for n, s, _ in steps)["ncu_bytes"]
    assert float(re.search(r"--timeout (\d+)", cmd["ncu_bytes"])[1]) < ncu_limit
    # every attention method bench attention knows, but the deterministic-dQ variants
    from ckptlab.cli.bench_attention import IMPLS

    impls = re.search(r"--impl (\S+)", cmd["bench_attention"])[1].split(",")
    assert impls == [i for i in IMPLS if not i.endswith("-det")] and "naive" in impls


@pytest.mark.slow  # collects the whole suite: 15-35 s
def test_dry_run_names_exactly_the_files_with_gpu_tests(dry_run):
    """The files named on the pytest_gpu line are the ones pytest's own -m gpu selection finds:
    a new GPU test file is not left out, and no file without GPU tests is collected there."""
    _, _, _, steps = dry_run
    line = dict((n, c) for n, _, c in steps)["pytest_gpu"]
    named = {w for w in line.split() if w.startswith("tests/")}
    p = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q",
                        "-p", "no:cacheprovider", "tests"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    found = {ln.split("::")[0] for ln in p.stdout.splitlines() if "::" in ln}
    assert found <= named, (named, found)
    # A file pytest did not collect here must be one that skips whole for a missing optional
    # package (PyTorch): on a GPU machine with it installed, that file's tests run.
    for f in sorted(named - found):
        q = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q",
                            "-rs", "-p", "no:cacheprovider", f], cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
        assert "could not import" in q.stdout and "::" not in q.stdout, (f, q.stdout)


def test_dry_run_packs_what_the_device_tool_brings_back(dry_run):
    _, out, results, steps = dry_run
    files = sorted(f.name for f in out.iterdir())
    assert files == ["environment.txt", "gpu-results.tar.gz", "summary.txt"]
    assert len(files) <= 8 and all(f.stat().st_size < 16 << 20 for f in out.iterdir())
    with tarfile.open(out / "gpu-results.tar.gz") as t:
        names = {Path(m.name).name for m in t.getmembers() if m.isfile()}
    assert {f"{s}.log" for s in STEPS} | {"summary.txt", "environment.txt"} <= names
    assert "DRY RUN" in (out / "summary.txt").read_text()


def test_dry_run_without_out_packs_into_a_temporary_folder(tmp_path):
    p = check_script("--dry-run", str(tmp_path / "r"), env_extra={"GPU_CHECK_DRY_RUN": "0"})
    assert p.returncode == 0 and "check_out: /tmp/" in p.stdout and " fits: 3 files" in p.stdout
    p2 = check_script(str(tmp_path / "r2"), env_extra={"GPU_CHECK_DRY_RUN": "1"})
    assert p2.returncode == 0 and "DRY RUN" in p2.stdout


def test_without_a_gpu_the_real_run_stops_after_the_environment(tmp_path):
    """Not a dry run: the env step runs bench/gpu_env.py, which finds no GPU here; the script
    says so, packs what it has for the device tool, and exits 2 without running a GPU step."""
    out = tmp_path / "OUT"
    out.mkdir()
    p = check_script(str(tmp_path / "r"), env_extra={"OUT": str(out)})
    assert p.returncode == 2, p.stdout + p.stderr
    assert "== env (limit" in p.stdout and "no usable GPU" in p.stdout
    assert "== pytest_gpu" not in p.stdout
    env_txt = (out / "environment.txt").read_text()
    assert "CuPy" in env_txt and "python " in env_txt
    assert (out / "gpu-results.tar.gz").is_file()


# ------------------------------------------------------------- gpu_lib.sh, one function at a time


def lib(script: str, tmp_path) -> subprocess.CompletedProcess:
    prologue = (f"OUT_DIR={tmp_path}; SUMMARY={tmp_path}/summary.txt; KILL_S=1; "
                f": > $SUMMARY; source {LIB}; ")
    return subprocess.run(["bash", "-c", prologue + script], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("body, status, failed", [
    ("echo fine", "passed", 0),
    ("echo working; echo 'SKIPPED: ncu cannot read the counters: LibraryNotLoaded'; exit 3",
     "skipped (ncu cannot read the counters: LibraryNotLoaded)", 0),
    ("echo 'internal error'; exit 3", "FAILED (exit 3)", 1),  # pytest's 3: no SKIPPED line
    ("exit 1", "FAILED (exit 1)", 1),
    ("sleep 30", "TIMED OUT (limit 2 s)", 1),
])
def test_a_step_is_classified_by_its_exit_and_last_line(tmp_path, body, status, failed):
    p = lib(f'add_step demo 2 bash -c "{body}"; run_step demo "${{STEP_LIMITS[0]}}" '
            f'"${{STEP_CMDS[0]}}"; echo "status=$STEP_STATUS failed=$failed"', tmp_path)
    assert f"status={status} failed={failed}" in p.stdout, p.stdout + p.stderr
    assert f"demo: {status} in" in (tmp_path / "summary.txt").read_text()


def test_a_command_is_kept_exactly_as_given(tmp_path):
    """Arguments with spaces, quotes or $ survive the plan: the dry run shows what runs."""
    p = lib("add_step q 5 printf '<%s>' 'two words' 'it''s' '$HOME' a,b; "
            'echo "${STEP_CMDS[0]}"; eval "${STEP_CMDS[0]}"', tmp_path)
    shown, ran = p.stdout.splitlines()
    assert shown.startswith("printf ") and "a,b" in shown
    assert ran == "<two words><its><$HOME><a,b>"


def test_packing_leaves_out_big_files_and_checks_the_limits(tmp_path):
    results, out = tmp_path / "results", tmp_path / "OUT"
    results.mkdir()
    out.mkdir()
    (results / "small.csv").write_text("a,b\n1,2\n")
    (results / "huge.bin").write_bytes(__import__("os").urandom(17 << 20))  # won't compress
    p = subprocess.run(["bash", "-c", f"OUT_DIR={results}; SUMMARY={results}/summary.txt; "
                        f": > $SUMMARY; source {LIB}; pack_out {out}; echo rc=$?"],
                       capture_output=True, text=True, timeout=120)
    assert "rc=0" in p.stdout, p.stdout + p.stderr
    assert "left out of the tarball: results/huge.bin" in p.stdout
    with tarfile.open(out / "gpu-results.tar.gz") as t:
        names = {Path(m.name).name for m in t.getmembers()}
    assert "small.csv" in names and "huge.bin" not in names
    for k in range(8):  # nine files in $OUT: more than the device tool brings back
        (out / f"extra{k}.txt").write_text("x")
    p = lib(f"check_out {out}; echo rc=$?", tmp_path)
    assert "rc=1" in p.stdout and "does NOT fit" in p.stdout
