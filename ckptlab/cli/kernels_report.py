"""`python -m ckptlab kernels`: registers, shared memory, spills and barriers of every kernel,
from ptxas' report (ckptlab.kernels.nvrtc compiles; this formats and prints), for each --arch
the instantiations that arch supports, then those it refuses and why (ckptlab.kernels.archs);
`--support` prints which methods and dtypes run on which arch, without compiling."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ckptlab.device import KERNELS_DIR
from ckptlab.kernels import archs
from ckptlab.kernels.nvrtc import BACKENDS, CompileError, CompilerNotFound, _resolve, report
from ckptlab.kernels.table import dynamic_shared_bytes


def format_report(rows: list[dict]) -> str:
    """A fixed-width table: file, kernel, arch, registers, static smem, the dynamic smem the
    wrappers launch it with (tensor-core kernels), stack, spills, barriers."""
    if not rows:
        return f"no kernels: no *.cu files in {KERNELS_DIR}"

    def cell(v):
        return "-" if v is None else str(v)

    head = ("file", "kernel", "arch", "regs", "smem B", "dyn smem B", "stack B", "spill st/ld B",
            "barriers")
    table = [head]
    for r in rows:
        name = r["kernel"] if r["kind"] == "kernel" else f"{r['kernel']} (device fn)"
        spills = f"{cell(r['spill_stores'])}/{cell(r['spill_loads'])}"
        table.append(
            (
                r["file"],
                name,
                cell(r["arch"]),
                cell(r["registers"]),
                cell(r["smem"]),
                cell(dynamic_shared_bytes(r["kernel"]) if r["kind"] == "kernel" else None),
                cell(r["stack"]),
                spills,
                cell(r["barriers"]),
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = [
        "  ".join(
            c.ljust(w) if i < 3 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in table
    ]
    lines.insert(1, "-" * len(lines[0]))
    lines.append(f"compiler: {rows[0]['backend']}")
    return "\n".join(lines)


def format_refused(files, arch_list) -> str:
    """The default instantiations each arch refuses, with the reason ('' when none)."""
    lines = []
    for arch in arch_list:
        for path in _resolve(files):
            lines += [f"{arch}  {path.name}  {k}: refused, {reason}"
                      for k, reason in archs.refused(path.name, arch).items()]
    return "\n".join(lines)


def kernel_files(given: list[str]) -> list[Path]:
    """The .cu files of the kernels folder that `given` names (a name such as attn_flash_fwd.cu
    or attn_flash_fwd, or a path to one); ValueError for anything else: this command reports
    ckptlab's kernels, it does not compile other files."""
    folder = Path(KERNELS_DIR).resolve()
    ours = {p.name: p for p in sorted(folder.glob("*.cu"))}
    out = []
    for text in given:
        p = Path(text)
        name = p.name if p.suffix == ".cu" else p.name + ".cu"
        inside = p.parent == Path(".") or (p.parent.resolve() == folder if p.parent.is_dir()
                                           else False)
        if not (inside and name in ours):
            raise ValueError(f"files: {text!r} is not a kernel of {folder}: expected one of "
                             f"{', '.join(ours)} (a name, or a path to one)")
        out.append(ours[name])
    return out


def arch_name(text: str) -> str:
    try:
        return f"sm_{archs.arch_number(text)}"
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv=None) -> int:
    """`python -m ckptlab kernels [--arch sm_90] [--backend nvrtc|nvcc] [files...]`."""
    parser = argparse.ArgumentParser(
        prog="python -m ckptlab kernels",
        description=(
            "Compile kernels/*.cu with NVIDIA's compiler (no GPU needed) and print each kernel's "
            "registers, shared memory, spills and barriers from ptxas' report."
        ),
    )
    parser.add_argument("files", nargs="*", help="kernels/*.cu files, by name (attn_flash_fwd.cu "
                        "or attn_flash_fwd) or path (default: all)")
    parser.add_argument(
        "--arch", action="append", type=arch_name,
        help=f"one of {', '.join(archs.ARCHS)} (repeatable; default sm_90)"
    )
    parser.add_argument("--backend", choices=BACKENDS, help="default: nvrtc if it loads, else nvcc")
    parser.add_argument("--support", action="store_true", help="print which methods and dtypes "
                        "run on which arch (no compiler needed) and exit")
    args = parser.parse_args(argv)
    if args.support:
        print(archs.format_support_table(archs.support_table()))
        return 0
    arch_list = args.arch or ["sm_90"]
    try:
        files = kernel_files(args.files) if args.files else None
        refused = format_refused(files, arch_list)
        rows = []
        for arch in arch_list:
            rows += report(files, arch, args.backend)
    except (CompilerNotFound, ValueError) as e:  # a usage error, or no compiler: one line, 2
        parser.error(str(e))
    except CompileError as e:  # a kernel that does not compile: the check failed
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(format_report(rows))
    if refused:
        print("\nnot compiled, the arch cannot run them:\n" + refused)
    return 0


if __name__ == "__main__":
    sys.exit(main())
