"""What the machine is, for bench/gpu_check.sh's environment.txt: Python and package versions,
the GPU as CuPy and PyTorch see it (name, multiprocessors, the exact L2 size in bytes), the
kernel (gVisor reports 4.4.0), ncu's version, the checkout's commit.

    python bench/gpu_env.py [--allow-no-gpu]

Exit status 2 when CuPy is missing or sees no GPU (the check cannot run), unless --allow-no-gpu
(the dry run on a CPU machine); 0 otherwise. Never fails on a missing optional tool.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def version(name: str) -> str:
    try:
        module = __import__(name)
        return getattr(module, "__version__", "?")
    except Exception as e:  # missing, or broken: say which
        return f"unavailable ({type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''})"


def command(argv, timeout=15) -> str:
    if shutil.which(argv[0]) is None:
        return f"{argv[0]}: not on the PATH"
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return (p.stdout + p.stderr).strip() or f"(no output, exit {p.returncode})"
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{argv[0]}: {type(e).__name__}: {e}"


def cupy_gpu() -> tuple[bool, str]:
    """(CuPy sees a GPU, a line describing it). Only the first part decides whether the GPU
    steps run: a property this CuPy does not report is printed as '?', never fatal."""
    try:
        import cupy as cp

        if not cp.cuda.is_available():
            return False, "CuPy sees no CUDA device (cupy.cuda.is_available() is False)"
    except Exception as e:
        return False, f"CuPy cannot be used: {type(e).__name__}: {e}"
    try:
        p = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        name = p.get("name", b"?")
        name = name.decode() if isinstance(name, bytes) else name
        return True, (f"CuPy: {name}, compute capability {p.get('major', '?')}."
                      f"{p.get('minor', '?')}, {p.get('multiProcessorCount', '?')} SMs, L2 "
                      f"{p.get('l2CacheSize', '?')} bytes, {p.get('totalGlobalMem', '?')} bytes "
                      f"of memory, shared memory per SM {p.get('sharedMemPerMultiprocessor', '?')}"
                      f" bytes; CUDA runtime {cp.cuda.runtime.runtimeGetVersion()}, driver "
                      f"{cp.cuda.runtime.driverGetVersion()}; current stream ptr "
                      f"{cp.cuda.get_current_stream().ptr}")
    except Exception as e:
        return True, f"CuPy sees a GPU; its properties could not be read: {type(e).__name__}: {e}"


def torch_gpu() -> str:
    try:
        import torch
    except Exception as e:
        return f"PyTorch unavailable ({type(e).__name__}): the peer step times ckptlab alone"
    if not torch.cuda.is_available():
        return f"PyTorch {torch.__version__}: no CUDA"
    try:
        p = torch.cuda.get_device_properties(0)
    except Exception as e:
        return f"PyTorch {torch.__version__}: device properties unreadable: {e}"
    return (f"PyTorch {torch.__version__} (CUDA {torch.version.cuda}): {p.name}, "
            f"{p.multi_processor_count} SMs, L2 {getattr(p, 'L2_cache_size', '?')} bytes; "
            f"current stream {torch.cuda.current_stream().cuda_stream}; float32 matmul "
            f"precision {torch.get_float32_matmul_precision()!r}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--allow-no-gpu", action="store_true")
    a = p.parse_args(argv)
    ok, gpu = cupy_gpu()
    lines = [
        f"python {sys.version.split()[0]} ({sys.executable}); kernel {platform.release()}",
        "packages: " + ", ".join(f"{n} {version(n)}" for n in
                                 ("numpy", "cupy", "torch", "matplotlib", "tqdm", "pytest")),
        "checkout: " + command(["git", "-C", str(ROOT), "log", "-1", "--format=%H %s"]),
        "nvidia-smi: " + command(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,"
                                  "clocks.sm,clocks.max.sm", "--format=csv,noheader"]),
        gpu,
        torch_gpu(),
        "ncu: " + command(["ncu", "--version"]).replace("\n", " | "),
    ]
    print("\n".join(lines), flush=True)
    if not ok and not a.allow_no_gpu:
        print("gpu_env: no usable GPU: the GPU steps cannot run")
        return 2
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # this checkout's ckptlab, installed or not
    from ckptlab.args import exit_with  # one line for a write error; quiet into | head

    exit_with(main)
