"""bench/gpu_ncu.py and bench/gpu_peer.py without a GPU. ncu is simulated by a stand-in on the
PATH that prints what the real one prints (a profile with the case markers, or gVisor's refusal
to read counters) and records how it was called; the peer comparison runs end to end on the
emulator, with PyTorch on the CPU and without PyTorch."""

import csv
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NCU_SCRIPT = ROOT / "bench" / "gpu_ncu.py"
PEER_SCRIPT = ROOT / "bench" / "gpu_peer.py"
HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
          '"Section Name","Metric Name","Metric Unit","Metric Value"')


def csv_rows(launches):
    """ncu's default CSV page for (kernel, bytes read, bytes written) launches, in order."""
    out = [HEADER]
    for i, (name, r, w) in enumerate(launches):
        for metric, v in (("dram__bytes_read.sum", r), ("dram__bytes_write.sum", w)):
            out.append(f'"{i}","7","python3","h","{name}","1","7","Command line profiler '
                       f'metrics","{metric}","byte","{v}"')
    return "\n".join(out)


def fake_ncu(tmp_path, output: str, exit_code=0) -> Path:
    """A folder with an `ncu` that records its argv and prints `output`."""
    folder = tmp_path / "bin"
    folder.mkdir(parents=True)
    ncu = folder / "ncu"
    ncu.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        printf '%s\\n' "$@" > {tmp_path}/ncu_argv.txt
        cat <<'EOF'
        {textwrap.indent(output, '        ').strip()}
        EOF
        exit {exit_code}
    """))
    ncu.chmod(ncu.stat().st_mode | stat.S_IEXEC)
    return folder


def run_ncu_script(tmp_path, path_dirs, *args):
    env = dict(os.environ, PATH=os.pathsep.join([*map(str, path_dirs), "/usr/bin", "/bin"]))
    return subprocess.run([sys.executable, str(NCU_SCRIPT), "--out", str(tmp_path / "out"),
                           *args], capture_output=True, text=True, timeout=120, env=env)


def test_ncu_profiles_every_case_in_one_process_and_splits_them_by_marker(tmp_path):
    marker = "attn_ncu_case_marker"
    launches = [(marker, 0, 0), ("attn_naive_scores", 1000, 400), ("attn_naive_pv", 30, 20),
                (marker, 0, 0), ("attn_flash_fwd", 700, 300), ("attn_flash_bwd_dq", 5, 5)]
    output = ("==PROF== Connected to process 1 (python3)\ncase 0 done\n"
              + csv_rows(launches))
    folder = fake_ncu(tmp_path, output)
    p = run_ncu_script(tmp_path, [folder], "--n", "64", "--impl", "naive,flash",
                       "--batch", "1", "--heads", "2")
    assert p.returncode == 0, p.stdout + p.stderr
    argv = (tmp_path / "ncu_argv.txt").read_text().splitlines()
    assert argv.count("-c") == 1, "one profiled Python process for every case"
    assert argv[argv.index("--clock-control") + 1] == "none"
    assert argv[argv.index("--kernel-name") + 1] == "regex:attn_"
    child = argv[-1]
    assert "gpu_ncu.child(" in child and child.count('"impl"') == 2
    rows = list(csv.DictReader(open(tmp_path / "out" / "ncu_bytes.csv")))
    assert [(r["impl"], int(r["launches"]), float(r["measured_bytes"])) for r in rows] == [
        ("naive", 2, 1450.0), ("flash", 2, 1010.0)]
    assert all(float(r["modeled_bytes"]) > 0 for r in rows)  # traffic.py knows both methods


def test_ncu_without_counters_is_skipped_with_the_reason(tmp_path):
    """As under gVisor: ncu starts, cannot read the counters, the program runs unprofiled."""
    output = ("==PROF== Connected to process 12 (python3)\n"
              "==ERROR== Failed to initialize the profiler: LibraryNotLoaded\n"
              "case 0 done\n==PROF== Disconnected from process 12\n")
    for code in (0, 1):  # whatever ncu's own exit status
        folder = fake_ncu(tmp_path / str(code), output, exit_code=code)
        p = run_ncu_script(tmp_path / str(code), [folder], "--n", "64", "--impl", "naive")
        assert p.returncode == 3, p.stdout + p.stderr
        last = p.stdout.strip().splitlines()[-1]
        assert last.startswith("SKIPPED: ncu cannot read the GPU's performance counters")
        assert "LibraryNotLoaded" in last


def test_ncu_missing_is_skipped_and_a_broken_profile_fails(tmp_path):
    p = run_ncu_script(tmp_path, [])
    assert p.returncode == 3 and p.stdout.strip().endswith("not on the PATH")
    folder = fake_ncu(tmp_path, csv_rows([("attn_naive_scores", 1, 1)]))  # no marker
    p = run_ncu_script(tmp_path, [folder], "--n", "64", "--impl", "naive")
    assert p.returncode == 1 and "before any marker" in p.stdout


def test_ncu_refuses_a_method_this_checkout_lacks(tmp_path):
    p = run_ncu_script(tmp_path, [], "--impl", "naive,warp-speed")
    assert p.returncode == 2 and "warp-speed" in p.stderr


# ------------------------------------------------------------------------- ckptlab vs PyTorch


def run_peer(tmp_path, *blocked, extra=()):
    """gpu_peer.py on the emulator at a tiny size, with some packages made unimportable."""
    code = textwrap.dedent(f"""\
        import importlib.abc, runpy, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in {blocked!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        sys.meta_path.insert(0, Block())
        sys.argv = ["gpu_peer.py", "--out", {str(tmp_path)!r}, "--device", "emu", "--n", "17",
                    "--batch", "1", "--heads", "2", "--d", "16", "--causal", "yes",
                    "--repeats", "2", *{list(extra)!r}]
        runpy.run_path({str(PEER_SCRIPT)!r}, run_name="__main__")
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def test_peer_compares_ckptlab_with_sdpa_on_the_same_inputs(tmp_path):
    pytest.importorskip("torch", reason="PyTorch (requirements-dev) is the peer here")
    p = run_peer(tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = list(csv.DictReader(open(tmp_path / "peer.csv")))
    timed = {(r["who"], r["method"], r["dtype"]) for r in rows if r["median_s"]}
    assert {("ckptlab", "naive", "float32"), ("ckptlab", "flash", "float32"),
            ("pytorch", "sdpa-math", "float32")} <= timed
    # the same timer for both: the method string of time_fn, on this CPU
    assert len({r["timer"] for r in rows if r["median_s"]}) == 1
    text = (tmp_path / "peer.txt").read_text()
    assert "ckptlab naive float32 / sdpa-math float32:" in text
    # SDPA's math backend in fp32 is an independent oracle: ckptlab's outputs and gradients
    # agree with it to fp32 rounding (both are within ~1e-6 of float64 at this size)
    errs = [float(x) for line in text.splitlines() if "vs SDPA math" in line
            for x in __import__("re").findall(r"(?:O|dQ|dK|dV) ([0-9.e+-]+)", line)]
    assert len(errs) == 4 * sum(1 for r in rows if r["who"] == "ckptlab")
    assert max(errs) < 1e-5, text


def test_peer_times_the_tensor_core_kernels_against_sdpa_flash_in_fp16(tmp_path):
    """--dtypes float32,float16 adds ckptlab's stored and flash in fp16 (the tensor-core
    kernels), paired with SDPA's flash backend in fp16: the same precision."""
    pytest.importorskip("torch", reason="PyTorch (requirements-dev) is the peer here")
    p = run_peer(tmp_path, extra=("--dtypes", "float32,float16"))
    assert p.returncode == 0, p.stdout + p.stderr
    rows = list(csv.DictReader(open(tmp_path / "peer.csv")))
    timed = {(r["who"], r["method"], r["dtype"]) for r in rows if r["median_s"]}
    assert {("ckptlab", "stored", "float16"), ("ckptlab", "flash", "float16"),
            ("ckptlab", "flash", "float32")} <= timed
    assert ("ckptlab", "naive", "float16") not in timed  # no tensor-core naive kernel
    text = (tmp_path / "peer.txt").read_text()
    errs = {m: [float(x) for x in __import__("re").findall(r"(?:O|dQ|dK|dV) ([0-9.e+-]+)", line)]
            for line in text.splitlines() if "vs SDPA math" in line
            for m in [line.split(" ckptlab ")[1].split(" vs ")[0]]}
    assert max(errs["flash float16"]) < 4e-3 and max(errs["flash float32"]) < 1e-5, text
    if ("pytorch", "sdpa-flash", "float16") in timed:  # where this PyTorch runs it on a CPU
        assert "ckptlab flash float16 / sdpa-flash float16:" in text


def test_peer_refuses_a_dtype_it_does_not_time(tmp_path):
    p = run_peer(tmp_path, "torch", extra=("--dtypes", "bfloat16"))
    assert p.returncode == 2 and "--dtypes: expected a comma-separated subset" in p.stderr


def test_peer_without_pytorch_times_ckptlab_alone(tmp_path):
    p = run_peer(tmp_path, "torch")
    assert p.returncode == 0, p.stdout + p.stderr
    rows = list(csv.DictReader(open(tmp_path / "peer.csv")))
    assert rows and all(r["who"] == "ckptlab" for r in rows)
    text = (tmp_path / "peer.txt").read_text()
    assert "PyTorch unavailable" in text and "(no PyTorch rows: no ratios)" in text


# ------------------------------------------------------------------------- the environment


def test_env_runs_the_steps_when_cupy_sees_a_gpu_whatever_it_reports(monkeypatch, capsys):
    """A property this CuPy does not report must not stop the run: only is_available decides."""
    from types import SimpleNamespace

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import gpu_env

    runtime = SimpleNamespace(getDeviceProperties=lambda i: {"name": b"NVIDIA H200"},
                              runtimeGetVersion=lambda: 13000, driverGetVersion=lambda: 13000)
    fake = SimpleNamespace(cuda=SimpleNamespace(
        is_available=lambda: True, runtime=runtime, Device=lambda: SimpleNamespace(id=0),
        get_current_stream=lambda: SimpleNamespace(ptr=0)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert gpu_env.main([]) == 0
    out = capsys.readouterr().out
    assert "CuPy: NVIDIA H200" in out and "L2 ? bytes" in out
    fake.cuda.is_available = lambda: False
    assert gpu_env.main([]) == 2 and "no usable GPU" in capsys.readouterr().out
    assert gpu_env.main(["--allow-no-gpu"]) == 0
