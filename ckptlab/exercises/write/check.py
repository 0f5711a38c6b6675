"""Check a learner's kernel: build it, run it on every case of its exercise (on the emulator with
the race and bounds checks on), compare every output with float64, and say what is wrong, where,
and why it might be; once it is right, its bytes beside the model's.

    report = check("flash_forward")            # labs/exercises/flash_forward.cu
    report = check("flash_forward", hint=2)    # the second, more specific hint
    print(report); report.status               # "right", "wrong", "not attempted", ...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ckptlab import device, emu
from ckptlab.exercises.write import evidence, feedback, files, regions
from ckptlab.exercises.write.class_hints import hints_of
from ckptlab.exercises.write.diagnose import Failure, diagnose, mismatch
from ckptlab.exercises.write.hints import hint as hint_for
from ckptlab.kernels.common import poison_value

RIGHT, WRONG, NOT_ATTEMPTED = "right", "wrong", "not attempted"
NO_BUILD, FAULT, MISSING = "does not build", "fault", "missing"
SENTINEL = 1.0e38  # an output poison no kernel computes: elements still holding it were unwritten
# Every launch of a check takes milliseconds on the emulator: one still running after this many
# seconds is stuck (a loop that never ends), and is stopped with the line it was on.
WATCHDOG_S = 10.0
NO_PICTURE_BUILD = "your kernel does not build, so there is no run to draw"
NO_PICTURE_FAULT = "the check stopped at a fault, so your kernel has no complete run to draw"


@dataclass
class Report:
    """What the check found. `lines[0]` is the verdict line; the rest explain it."""

    exercise: str
    status: str
    lines: list = field(default_factory=list)
    finding: object = None  # diagnose.Finding, for a wrong result
    pattern: str | None = None  # the hint key behind the message (also for faults)

    @property
    def ok(self) -> bool:
        return self.status == RIGHT

    def __str__(self) -> str:
        return "\n".join(self.lines)

    def __repr__(self) -> str:  # a notebook cell shows the report itself
        return str(self)


def shipped_text(ex) -> str:
    """The learner's file as shipped: the kernel with the exercise's steps cut out."""
    source = (device.KERNELS_DIR / ex.kernel).read_text()
    notes = {n: s.notes for n, s in ex.steps.items()}
    holders = {n: s.placeholder for n, s in ex.steps.items()}
    n = len(regions.exercise_regions(source, ex.name))
    header = (f"// Exercise {ex.name} (lab {ex.lab}): {ex.title}",
              *(f"// {line}" for line in ex.intro),
              f"// Fill in the {n} step{'s' if n > 1 else ''} marked '>>> YOUR CODE'; everything "
              "else is given.",
              f"// Check: python -m ckptlab exercise check {ex.name}   (--hint 2: a second hint)",
              f"// Solution (try first): kernels/{ex.kernel}, the kernel the labs run.",
              "")
    return regions.cut(source, ex.name, notes, holders, header)


def read_learner(path: Path, shown: str) -> tuple[str | None, Report | None]:
    """(the file's text, None), or (None, a Report saying why it cannot be read as source).
    A byte-order mark is dropped (g++ and Python accept one): the text built and compared is
    the rest."""
    try:
        return files.decode(path.read_bytes()), None
    except UnicodeDecodeError as e:
        return None, Report(path.stem, NO_BUILD, [
            f"{NO_BUILD}: {shown} is not UTF-8 text (line {files.line_of(e.object, e.start)}: "
            f"byte {e.start} is {e.object[e.start]:#04x}): save it as UTF-8 (an accent in a "
            "comment, written in another encoding?), or is it the source file?"])
    except OSError as e:
        return None, Report(path.stem, MISSING, [f"{shown} cannot be read: {e.strerror}"])


def display_name(path: Path) -> str:
    """The path as messages show it: relative to the repository when it is inside it."""
    try:
        return str(path.resolve().relative_to(device.KERNELS_DIR.parent))
    except ValueError:
        return str(path)


def _compare(ex, case, out, truth) -> list:
    """The outputs of `case` that differ from float64 (an output that an instantiation does
    not produce, absent from `out`, is not compared)."""
    failures = []
    for o in ex.outputs:
        if o.name not in out:
            continue
        x, r = np.asarray(device.to_numpy(out[o.name])), np.asarray(truth[o.name], np.float64)
        bad = mismatch(x, r, ex.rtol)
        if bad.any():
            failures.append(Failure(case, o, x, r, bad))
    return failures


def _unwritten(ex, case, inputs, failures) -> None:
    """Rerun a failing case with a sentinel poison: what still holds it was never written."""
    if not any((~np.isfinite(f.x)).any() for f in failures):
        return
    with poison_value(SENTINEL):
        again = ex.run(case, inputs)
    for f in failures:
        f.unwritten = np.asarray(device.to_numpy(again[f.output.name])) == np.float32(SENTINEL)


def _table(ex, results: dict) -> list[str]:
    """A line per case run: its sizes, then per output 'ok' or its largest relative error
    ('-': an output that case's instantiation does not produce)."""
    names = [o.name for o in ex.outputs]
    ran = [c for c in ex.cases if c.label in results]
    width = max(len(c.label) for c in ran) + 2
    out = ["  " + "case".ljust(width) + "".join(f"{n:>10}" for n in names) + "   sizes"]
    for c in ran:
        cells = results[c.label]
        row = "".join(f"{cells.get(n, '-'):>10}" for n in names)
        out.append("  " + c.label.ljust(width) + row + "   " + c.describe())
    later = [c for c in ex.cases if c.label not in results]
    if later:
        kinds = ", ".join(dict.fromkeys(c.variant for c in later))
        out.append(f"  (and {len(later)} cases through the file's other instantiations ({kinds}):"
                   " they run once every case above is right)")
    return out


def _only_there(ex, case) -> list[str]:
    """For a fault in another instantiation than the default: a line saying which, and that
    the default one ran every case clean."""
    if not case.variant:
        return []
    what = next(c.phrase for c in ex.cases if c.label == case.variant)
    return [f"every case ran clean in the default instantiation; this one is {what}"]


def _instantiations(ex) -> str:
    """The 'right' line's list of cases: the default instantiation's, then the others."""
    default = [c.label for c in ex.cases if not c.variant]
    others: dict = {}
    for c in ex.cases:
        if c.variant:
            others[c.variant] = others.get(c.variant, 0) + 1
    text = f"{len(ex.cases)} cases: " + ", ".join(default)
    if others:
        text += ("; again through the file's other instantiations: "
                 + ", ".join(f"{v} ({n} cases)" for v, n in others.items()))
    return text


def _cell(f: Failure) -> str:
    x = f.x.astype(np.float64)
    if not np.isfinite(x[f.bad]).all():
        return "NaN/inf"
    finite = f.r[np.isfinite(f.r)]
    scale = max(float(np.abs(finite).max()) if finite.size else 1.0, 1e-30)
    with np.errstate(invalid="ignore"):
        return f"{np.nanmax(np.abs(x - f.r)[f.bad]) / scale:.1e}"


def _bytes(ex, case, inputs) -> list[str]:
    """The learner's counted and unique bytes at `case` beside the model's (which the shipped
    kernel's counts equal exactly: the tests hold every kernel to it)."""
    if ex.traffic is None or device.target() != "emu":
        return []
    with emu.record() as rec:
        ex.run(case, inputs)
    model = {k.kernel: k for k in ex.traffic(case)}
    mine: dict = {}  # the first launch of each kernel (a case may launch one kernel twice)
    for launch in rec.launches:
        if launch.kernel in model or launch.kernel in ex.kernels:
            mine.setdefault(launch.kernel, launch.args)
    out = [f"bytes at {case.describe()} (counted: every request, no cache; unique: distinct "
           "bytes):", f"  {'kernel':<42}{'yours counted':>15}{'model':>12}{'yours unique':>14}"
           f"{'model':>12}"]
    notes = []
    for name, args in mine.items():
        m = model.get(name)
        counted = sum(a.read_bytes + a.write_bytes + a.atomic_bytes for a in args.values())
        unique = sum(a.unique_read_bytes + a.unique_write_bytes for a in args.values())
        mc = f"{m.bytes:,}" if m else "-"
        mu = f"{m.unique_bytes:,}" if m else "-"
        out.append(f"  {name:<42}{counted:>15,}{mc:>12}{unique:>14,}{mu:>12}")
        for arg, a in args.items():
            if m is None or arg not in m.read:
                continue
            want = m.read[arg] + m.write[arg] + 4 * m.atomics[arg]
            got = a.read_bytes + a.write_bytes + a.atomic_bytes
            if got != want:
                ratio = f"{got / want:.2f}x" if want else "where the model moves none"
                notes.append(f"  {name.split('<')[0]} moves {got:,} bytes of {arg}, {ratio} "
                             f"the model's {want:,}")
    if notes:
        out += ["right, but not the shipped kernel's traffic: the same results with more "
                "global memory requests:"] + notes
    else:
        out.append("  the same bytes as the shipped kernel (= the model), argument by argument")
    return out


def _second_look(ex, text, shown, f, failures, arrays, results):
    """The finding to lead with once a second look is taken (evidence.py), where the first
    says little (a NaN, a zero, a factor, a part, "everywhere"): a local read before it is set
    (the failing case rerun with locals at 0), else what the right outputs beside the wrong
    ones say where the finding is only "wrong everywhere"; `f` and its others follow it."""
    if f.rank > 2:  # a slip, a class, a case or "across tiles" already says more (and the
        return f     # rerun costs a second build of the file: ~1-3 s)
    failure = next(x for x in failures
                   if x.output.name == f.output and x.case.label == f.case.label)
    better = evidence.uninitialised_local(ex, text, shown, failure, arrays[f.case.label],
                                          ex.rtol)
    if better is None and f.pattern == "everywhere":
        better = evidence.implied(ex, f, results)
    if better is None:
        return f
    better.others = ([f] if better.where[:len(f.where)] != f.where else []) + f.others
    return better


def picture(ex, case, inputs, path, wrong=None) -> list[str]:
    """Draw who wrote each element of the exercise's outputs in `case` (the emulator's access
    trace of the learner's kernel) to `path` (PNG, PDF or SVG, as its suffix says); beside each
    output in `wrong` ({name: bool array, True where it differs from float64}), its wrong
    elements. The lines that say so."""
    from ckptlab.measure.access_plots import plot_access_map

    if not ex.picture or device.target() != "emu":
        return ["(no picture: the access trace runs on the emulator only)"]
    kernel, args = ex.picture
    with emu.trace() as tr:
        ex.run(case, inputs)
    mine = [t for t in tr.traces if t.kernel.split("<")[0] == kernel]
    if not mine:
        return [f"(no picture: no launch of {kernel} in case {case.label})"]
    marks = {n: b for n, b in (wrong or {}).items()
             if n in args and np.size(b) == int(np.prod(mine[0][n].shape))}
    title = (f"your {mine[0].kernel}, case {case.label}: which block wrote each element of "
             f"{', '.join(args)} (white: none, grey: several)")
    if marks:
        title += f"; beside {', '.join(marks)}: its elements that differ from float64 (black)"
    files.save_picture(plot_access_map(mine[0], args, kind="write", color="block", title=title,
                                       wrong=marks), path)
    shown = f"which block wrote each element of {', '.join(args)}"
    if marks:
        shown += f"; beside it, the wrong elements of {', '.join(marks)}"
    return [f"picture: {path} ({shown}, case {case.label})"]


def _no_picture(path, why: str) -> list[str]:
    """The line saying why no picture was drawn at `path` (none if none was asked for)."""
    return [] if path is None else [f"(no picture drawn at {path}: {why})"]


def check(ex, file=None, hint: int = 1, picture_path=None, shipped=None) -> Report:
    """The report for exercise `ex` (a spec.Exercise) on the learner's file (or `file`); with
    `picture_path`, also the picture of who wrote what (and, for a wrong result, which elements
    are wrong) for the case the report is about. A picture path whose suffix is not .png, .pdf
    or .svg, or that holds a file ckptlab did not draw, is refused (ValueError) before any work;
    where no picture can be drawn, a line says why. `shipped`: the file as shipped, if not the
    guided one (the from-scratch track's)."""
    if picture_path is not None:
        files.picture_format(picture_path)  # before any work: a name it may not draw over
    path = Path(file) if file is not None else ex.learner_file
    shown = display_name(path)
    if not path.is_file():
        return Report(ex.name, MISSING, [f"{ex.name}: {shown} is missing; `python -m ckptlab "
                                         f"exercise reset {ex.name}` puts it back as shipped",
                                         *_no_picture(picture_path, "no file to check")])
    text, bad = read_learner(path, shown)
    if bad is not None:
        bad.lines += _no_picture(picture_path, "the file cannot be read as source")
        return bad
    shipped = shipped_text(ex) if shipped is None else shipped
    if regions.not_attempted(text, shipped):
        n = len(regions.steps(shipped)) or len(ex.steps)
        return Report(ex.name, NOT_ATTEMPTED, [
            f"not attempted: fill in {shown} (step{'s 1-' + str(n) if n > 1 else ' 1'}, marked "
            "'>>> YOUR CODE'), then check again",
            *_no_picture(picture_path, "not attempted yet")])
    todo = regions.untouched_steps(text, shipped)
    still = ([f"(step{'s' if len(todo) > 1 else ''} {', '.join(map(str, todo))} "
              f"{'are' if len(todo) > 1 else 'is'} still as shipped)"] if todo else [])
    results: dict = {}
    failures: list = []
    gpu = device.target() == "cuda"
    with device.kernel_file(ex.kernel, text, name=shown, poison_locals=True), \
            emu.settings(mode="counted", race_check=True, watchdog_s=WATCHDOG_S):
        seen_inputs, arrays = {}, {}
        for case in ex.cases:
            if case.variant and failures:  # the default instantiation first: fix that one
                continue
            inputs = seen_inputs[case.label] = ex.inputs(case)
            try:
                out = ex.run(case, inputs)
            except emu.EmuCompileError as e:
                return Report(ex.name, NO_BUILD, [f"{NO_BUILD}: {ex.name}",
                              *feedback.compile_report(str(e), shown, text), *still,
                              *_no_picture(picture_path, NO_PICTURE_BUILD)])
            except emu.EmuError as e:
                pattern = feedback.fault_pattern(e)
                why = (evidence.race_in_another_head(ex, case, inputs, e)
                       if pattern == "global_race" else None)
                if why is not None:
                    pattern = why[0]
                return Report(ex.name, FAULT, [
                    f"{FAULT}: {ex.name}, in case {case.label} ({case.describe()})",
                    *feedback.fault_report(e, shown, text), *_only_there(ex, case),
                    *([why[1]] if why else []),
                    f"hint {min(hint, 2)}: " + hint_for(hints_of(ex), None, pattern, hint), *still,
                    *_no_picture(picture_path, NO_PICTURE_FAULT)], pattern=pattern)
            except Exception as e:  # a GPU build error (NVRTC) arrives as CuPy's own type
                if gpu and type(e).__name__ == "CompileException":
                    return Report(ex.name, NO_BUILD, [f"{NO_BUILD}: {ex.name}",
                                  *feedback.compile_report(str(e), shown, text), *still,
                                  *_no_picture(picture_path, NO_PICTURE_BUILD)])
                raise
            made = [o.name for o in ex.outputs if o.name in out]
            arrays[case.label] = {n: np.asarray(device.to_numpy(out[n])) for n in made}
            mine = _compare(ex, case, out, ex.truth(case, inputs))
            if mine:
                _unwritten(ex, case, inputs, mine)
            failures += mine
            results[case.label] = {n: "ok" for n in made} | {
                f.output.name: _cell(f) for f in mine}
        if failures:
            f = diagnose(failures, list(ex.cases), list(ex.outputs), ex.alternatives,
                         seen_inputs, arrays, ex.rtol)
            f = _second_look(ex, text, shown, f, failures, arrays, results)
            if picture_path is not None:
                wrong = {m.output.name: m.bad for m in failures if m.case.label == f.case.label}
                still = still + picture(ex, f.case, seen_inputs[f.case.label], picture_path,
                                        wrong)
            lines = [f"{WRONG}: {ex.name}: {f.where}.",
                     f"  e.g. {f.example}",
                     *(f"  also {o.where}." for o in f.others),
                     "each case against float64 ('ok', else the largest error relative to the "
                     "output's largest magnitude):", *_table(ex, results),
                     f"hint {min(hint, 2)}: " + hint_for(hints_of(ex), f.output, f.pattern, hint),
                     *still]
            return Report(ex.name, WRONG, lines, finding=f, pattern=f.pattern)
        lines = [RIGHT, f"{ex.name}: every output of every case matches float64 "
                 f"({_instantiations(ex)})"]
        if gpu:
            lines.append("(on the GPU: the race and bounds checks run on the emulator only; "
                         "`--device emu` runs them)")
        lines += _bytes(ex, ex.cases[0], ex.inputs(ex.cases[0]))
        if picture_path is not None:
            lines += picture(ex, ex.cases[0], ex.inputs(ex.cases[0]), picture_path)
        return Report(ex.name, RIGHT, lines)
