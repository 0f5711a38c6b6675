"""`python -m ckptlab kernels`: registers, shared memory, spills and barriers of every kernel,
from ptxas' report (ckptlab.kernels.nvrtc compiles; this formats and prints)."""

from __future__ import annotations

import argparse
import sys

from ckptlab.device import KERNELS_DIR
from ckptlab.kernels.nvrtc import BACKENDS, CompileError, CompilerNotFound, report
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


def main(argv=None) -> int:
    """`python -m ckptlab kernels [--arch sm_90] [--backend nvrtc|nvcc] [files...]`."""
    parser = argparse.ArgumentParser(
        prog="python -m ckptlab kernels",
        description=(
            "Compile kernels/*.cu with NVIDIA's compiler (no GPU needed) and print each kernel's "
            "registers, shared memory, spills and barriers from ptxas' report."
        ),
    )
    parser.add_argument("files", nargs="*", help="kernel files or names in kernels/ (default: all)")
    parser.add_argument(
        "--arch", action="append", help="sm_80, sm_90, ... (repeatable; default sm_90)"
    )
    parser.add_argument("--backend", choices=BACKENDS, help="default: nvrtc if it loads, else nvcc")
    args = parser.parse_args(argv)
    try:
        rows = []
        for arch in args.arch or ["sm_90"]:
            rows += report(args.files or None, arch, args.backend)
    except (CompilerNotFound, ValueError) as e:  # a usage error, or no compiler: one line, 2
        parser.error(str(e))
    except CompileError as e:  # a kernel that does not compile: the check failed
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(format_report(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
