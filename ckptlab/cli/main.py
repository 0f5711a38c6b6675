"""The command line: `python -m ckptlab [--device cuda|emu] COMMAND [options]`.

    tour                 the main job: gradient checks, store-P vs recompute over N, checkpoint
                         schedules; tables printed, CSVs and PNGs written (ckptlab.cli.tour)
    check                every kernel's gradients vs float64; exit 1 on a failure (cli.check)
    bench attention      naive, stored, flash: bytes, FLOPs, memory, time per size, and the
                         fusion and recompute gains (cli.bench_attention)
    bench checkpoint     peak memory, recompute and time per schedule (cli.bench_checkpoint)
    bench emu            how fast the CPU emulator runs (cli.bench_emu)
    bench torch          a torch GPT's step with ckptlab attention vs SDPA (cli.bench_torch)
    bench crossing       when recompute stops paying: stored / flash over d, GPU, dtype
                         (cli.bench_crossing)
    bench model-check    the time model against the FlashAttention papers' A100 numbers
                         (cli.model_check)
    bench plan-check     the step model and the planner against published training runs
                         (Narayanan et al. 2021, Korthikanti et al. 2022; cli.bench_plan_check)
    kernels              registers, shared memory, spills per kernel (cli.kernels_report)
    fig2                 the FlashAttention paper's Fig. 2 table (cli.fig2)
    plan                 a training run's layout by modeled step time: tensor, pipeline and
                         data parallelism, sharding and the recompute that fit (cli.plan)
    exercise             the kernels you write: list, check NAME [--hint 2], reset, solution
                         (cli.exercise)

`--device` (anywhere on the line) forces the target; `cuda` without a GPU is an error. Each
command's own options: `python -m ckptlab COMMAND --help`. Usage errors (an unknown command or
option, an output path that cannot be written, a size that cannot fit, a missing GPU or a C++
compiler that cannot build the emulator) print one line and exit with status 2, before any
work; a write error once the work ran (a full disk) prints one line, status 1; output piped
into a reader that stops early (`| head`) ends quietly (ckptlab.args: the same rule for every
command, `python -m ckptlab.torch.demo` and bench/*.py too).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

from ckptlab import device
from ckptlab.args import run_command
from ckptlab.cli.report import TooBig, UsageError

COMMANDS = {  # name -> module whose main(argv) runs it
    "tour": "ckptlab.cli.tour",
    "check": "ckptlab.cli.check",
    "kernels": "ckptlab.cli.kernels_report",
    "fig2": "ckptlab.cli.fig2",
    "plan": "ckptlab.cli.plan",
    "exercise": "ckptlab.cli.exercise",
}
BENCHES = {
    "attention": "ckptlab.cli.bench_attention",
    "checkpoint": "ckptlab.cli.bench_checkpoint",
    "emu": "ckptlab.cli.bench_emu",
    "torch": "ckptlab.cli.bench_torch",
    "crossing": "ckptlab.cli.bench_crossing",
    "model-check": "ckptlab.cli.model_check",
    "plan-check": "ckptlab.cli.bench_plan_check",
}
PROG = "python -m ckptlab"


def split_device(argv: list[str]) -> tuple[str | None, list[str]]:
    """Take `--device X` or `--device=X` out of argv wherever it is; (X or None, the rest)."""
    name, rest, k = None, [], 0
    while k < len(argv):
        a = argv[k]
        if a == "--device":
            if k + 1 >= len(argv):
                raise UsageError(f"{PROG}: --device needs a value: cuda or emu")
            name, k = argv[k + 1], k + 2
            continue
        if a.startswith("--device="):
            name = a.split("=", 1)[1]
        else:
            rest.append(a)
        k += 1
    return name, rest


def _help() -> str:
    return __doc__.strip()


def _bench_help() -> str:
    """The bench lines of this module's help, and where each one's options are."""
    lines = [line for line in __doc__.splitlines() if line.strip().startswith("bench ")]
    return "\n".join([f"usage: {PROG} bench {{{','.join(BENCHES)}}} [options]", "", *lines, "",
                      f"each one's options: {PROG} bench NAME --help"])


def check_environment() -> None:
    """Refuse a bad CKPTLAB_* variable in one line, before anything reads it (the emulator
    reads CKPTLAB_EMU_* when it is imported; the kernels' wrappers read CKPTLAB_KERNELS)."""
    env = os.environ
    folder = env.get("CKPTLAB_KERNELS")
    if folder is not None and not (Path(folder) / "common.cuh").is_file():
        raise UsageError(f"CKPTLAB_KERNELS={folder!r} is not a folder of ckptlab kernels (no "
                         "common.cuh in it); unset it to use the kernels/ that come with ckptlab")
    try:  # the emulator's own reading of CKPTLAB_EMU_* (numbers, flags, ranges, modes)
        from ckptlab.emu import config

        config.from_environment()
    except ValueError as e:
        raise UsageError(f"CKPTLAB_EMU_* in the environment: {e}") from None
    if env.get("CKPTLAB_CACHE_DIR"):
        check_cache_dir(env["CKPTLAB_CACHE_DIR"])


def check_cache_dir(root: str) -> None:
    """The emulator's cache folder named by CKPTLAB_CACHE_DIR: created if missing (mode 700,
    as the emulator would), safe (emu.cache.secure_dir's rules) and writable; else one line."""
    import tempfile

    from ckptlab.emu import cache

    def refuse(why: str):
        raise UsageError(f"CKPTLAB_CACHE_DIR={root!r}: {why}; point it at a folder of your own, "
                         "or unset it to use ~/.cache/ckptlab/emu")

    try:
        path = cache.secure_dir(Path(root))
    except cache.UnsafeCache as e:
        refuse(str(e))
    except OSError as e:
        refuse(f"cannot create it ({e.strerror})")
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        refuse(f"cannot write in it ({e.strerror})")


def resolve(rest: list[str]) -> tuple[str, list[str]]:
    """(module name, its argv) for the command at the front of `rest`."""
    if not rest:
        raise UsageError(f"{PROG}: a command is required: one of {', '.join(COMMANDS)}, bench "
                         f"{'|'.join(BENCHES)} (see {PROG} --help)")
    cmd, args = rest[0], rest[1:]
    if cmd == "bench":
        if not args or args[0] not in BENCHES:
            got = repr(args[0]) if args else "nothing"
            raise UsageError(f"{PROG} bench: expected one of {', '.join(BENCHES)}, got {got}")
        return BENCHES[args[0]], args[1:]
    if cmd not in COMMANDS:
        raise UsageError(f"{PROG}: unknown command {cmd!r}; expected one of "
                         f"{', '.join([*COMMANDS, 'bench'])} (see {PROG} --help)")
    return COMMANDS[cmd], args


def _run(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(_help())
        return 0
    if argv[:1] == ["bench"] and argv[1:2] in (["-h"], ["--help"]):
        print(_bench_help())
        return 0
    name, rest = split_device(argv)
    module_name, args = resolve(rest)
    check_environment()
    if name is not None:
        device.use(name)
    device.target()  # a bad CKPTLAB_DEVICE fails here, before any work
    module = importlib.import_module(module_name)
    return module.main(args)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_command(_run, argv, errors=(device.DeviceError, TooBig))
