"""The kernel exercises (ckptlab.exercises.write): the shipped files are the kernels with the
marked lines cut out, a shipped file reports "not attempted", every exercise filled with its
solution (the lab's own kernel) is right, and mistakes a learner makes get the diagnosis that
names the output and the class of the cause, without handing over the code."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from kernel_mistakes import MISTAKES

from ckptlab import device, emu
from ckptlab.exercises import write
from ckptlab.exercises.write import flash_cases, hints, regions
from ckptlab.exercises.write.check import NO_BUILD
from ckptlab.exercises.write.check import check as check_in_process
from ckptlab.kernels.table import instantiations, tile_head_dim

NAMES = list(write.KERNELS)


def solved(name: str) -> str:
    ex = write.get(name)
    return regions.fill(write.shipped_text(ex), (device.KERNELS_DIR / ex.kernel).read_text(),
                        name)


@pytest.mark.parametrize("name", NAMES)
def test_the_shipped_file_is_the_kernel_with_its_steps_cut(name):
    """labs/exercises/<name>.cu is exactly what shipped_text makes from kernels/ (no drift), and
    filling its steps with the kernel's own lines gives back the kernel's code."""
    ex = write.get(name)
    assert ex.learner_file.read_text() == write.shipped_text(ex), (
        f"{ex.learner_file} differs from what kernels/{ex.kernel} cuts to: regenerate it with "
        f"write.reset({name!r}, force=True)")
    code = [ln for ln in solved(name).splitlines()
            if not ln.lstrip().startswith("//") and ln.strip()]
    kernel = [ln for ln in (device.KERNELS_DIR / ex.kernel).read_text().splitlines()
              if not ln.lstrip().startswith("//") and ln.strip()]
    assert code == kernel


@pytest.mark.parametrize("name", NAMES)
def test_a_shipped_exercise_is_not_attempted(name):
    report = write.check(name)
    assert report.status == write.NOT_ATTEMPTED
    assert f"labs/exercises/{name}.cu" in str(report)
    assert write.status(name) == write.NOT_ATTEMPTED


def launchable(ex) -> set:
    """Every kernel the wrappers can launch from the exercise's file at the check's head dims
    and tiles: its extern "C" kernels and the template instantiations table.instantiations
    lists (what `python -m ckptlab kernels` compiles)."""
    source = (device.KERNELS_DIR / ex.kernel).read_text()
    dims = {tile_head_dim(c.sizes["d"]) for c in ex.cases if "d" in c.sizes}
    return set(emu.kernel_names(source)) | set(
        instantiations(ex.kernel, tuple(sorted(dims)) or (32,), tiles=flash_cases.TILES))


@pytest.mark.parametrize("name", NAMES)
def test_the_solution_is_right_and_moves_the_models_bytes(name, tmp_path):
    """The exercise filled with the kernel's lines passes every case, and its counted and unique
    bytes equal the model's argument by argument; on its way the check launched every kernel
    the wrappers can launch from the file (every template instantiation)."""
    path = tmp_path / f"{name}.cu"
    path.write_text(solved(name))
    with emu.record() as rec:  # in this process (write.check runs it in a child): the launches
        report = check_in_process(write.get(name), file=path)
    assert report.status == write.RIGHT, str(report)
    assert "the same bytes as the shipped kernel" in str(report), str(report)
    missing = launchable(write.get(name)) - {launch.kernel for launch in rec.launches}
    assert not missing, f"{name}: the check never launches {sorted(missing)}"


def _plant(name, old, new, tmp_path, hint=1):
    text = solved(name)
    assert old in text, f"{name}: the planted line is not in the solution: {old!r}"
    path = tmp_path / f"{name}.cu"
    path.write_text(text.replace(old, new, 1))
    return write.check(name, file=path, hint=hint)


def _solution_code(name) -> list[str]:
    """The code lines of the exercise's solution (what a hint must never spell out)."""
    ex = write.get(name)
    src = (device.KERNELS_DIR / ex.kernel).read_text()
    return [ln.split("//")[0].strip() for _, _, lines in regions.solution_lines(src, name)
            for ln in lines if len(ln.split("//")[0].strip()) > 12]


FIRST = {m[0]: i for i, m in reversed(list(enumerate(MISTAKES)))}


def _marks(i, m):
    return [] if FIRST[m[0]] == i else [pytest.mark.slow]


@pytest.mark.counted
@pytest.mark.parametrize("name,old,new,status,output,pattern", [
    pytest.param(*m, marks=_marks(i, m), id=f"{m[0]}-{i}") for i, m in enumerate(MISTAKES)])
def test_a_planted_mistake_gets_its_diagnosis(name, old, new, status, output, pattern,
                                              tmp_path):
    report = _plant(name, old, new, tmp_path)
    text = str(report)
    assert report.status == status, text
    if output is not None:
        assert report.finding.output == output, text
        assert text.startswith(f"wrong: {name}: {output} "), text
    if pattern is not None:
        assert pattern in (report.pattern, hints.family(report.pattern)), text
    hint_lines = [ln for ln in text.splitlines() if ln.startswith("hint")]
    if status != NO_BUILD:
        assert hint_lines, text
    for code in _solution_code(name):
        assert all(code not in h for h in hint_lines), f"the hint gives away {code!r}"


def test_every_kernel_exercise_has_five_planted_mistakes():
    for name in NAMES:
        assert sum(m[0] == name for m in MISTAKES) >= 5, name


@pytest.mark.slow
def test_the_second_hint_is_another_and_more_specific(tmp_path):
    """--hint 2 gives a different, longer hint for the same mistake, for every pattern the
    planted mistakes reach."""
    for name, old, new, status, _, _ in MISTAKES:
        if status != "wrong":
            continue
        one = _plant(name, old, new, tmp_path, hint=1)
        two = _plant(name, old, new, tmp_path, hint=2)
        h1 = [ln for ln in str(one).splitlines() if ln.startswith("hint 1: ")]
        h2 = [ln for ln in str(two).splitlines() if ln.startswith("hint 2: ")]
        assert h1 and h2 and h1[0][8:] != h2[0][8:], (name, new)


def test_a_step_left_as_shipped_is_named(tmp_path):
    """A file with some steps written and one left as shipped says which step is left."""
    ex = write.get("flash_forward")
    src = (device.KERNELS_DIR / ex.kernel).read_text()
    shipped = write.shipped_text(ex)
    solved_steps = {s: lines for s, _, lines in regions.solution_lines(src, ex.name)}
    out, skip = [], False
    for line in shipped.splitlines():  # fill every step but 3
        if m := regions.YOURS_BEGIN.match(line):
            out.append(line)
            if int(m["step"]) != 3:
                out += solved_steps[int(m["step"])]
                skip = True
        elif regions.YOURS_END.match(line):
            skip = False
            out.append(line)
        elif not skip:
            out.append(line)
    path = tmp_path / "flash_forward.cu"
    path.write_text("\n".join(out) + "\n")
    assert regions.untouched_steps(path.read_text(), shipped) == [3]
    report = write.check("flash_forward", file=path)
    assert report.status == write.WRONG
    assert "(step 3 is still as shipped)" in str(report)


def test_a_compile_error_points_at_the_learners_line_without_a_command_line(tmp_path):
    report = _plant("flash_forward", "acc[c] = alpha * acc[c] + pv;",
                    "acc[c] = alpha * acc[c] + pvv;", tmp_path)
    text = str(report)
    assert report.status == NO_BUILD
    line = next(n for n, ln in enumerate(solved("flash_forward").splitlines(), 1)
                if "acc[c] = alpha * acc[c] + pv;" in ln)
    assert f"flash_forward.cu:{line}: 'pvv' was not declared" in text, text
    assert f"{line:4d} > " in text and "^" in text
    assert "g++" not in text and "-fsanitize" not in text and len(text.splitlines()) <= 8


def test_a_fault_shows_the_emulators_message_and_the_lines_around(tmp_path):
    report = _plant("flash_backward", "                if (q0 + ii >= Nq) break;\n", "",
                    tmp_path)
    text = str(report)
    assert "out-of-bounds atomic" in text and "'dQ'" in text and "thread (" in text
    assert re.search(r"^\s+\d+ > .*atomicAdd", text, flags=re.M), text
    # the hint is the one for the fault's kind (an access out of bounds), not a generic one
    assert report.pattern == "access"
    ex = write.get("flash_backward")
    assert f"hint 1: {hints.hint(ex.hints, None, 'access', 1)}" in text.splitlines(), text
    assert hints.hint(ex.hints, None, "access", 1) != hints.hint(ex.hints, None, "fault", 1)


def test_regions_refuse_markers_that_do_not_pair():
    with pytest.raises(regions.MarkerError, match="never closed"):
        regions.regions("// >>> x 1: a\nint a;\n")
    with pytest.raises(regions.MarkerError, match="closes no region"):
        regions.regions("int a;\n// <<< x 1\n")
    with pytest.raises(regions.MarkerError, match="steps"):
        regions.exercise_regions("// >>> x 2: a\n// <<< x 2\n", "x")


def test_cut_keeps_the_lines_of_other_exercises_and_drops_their_markers():
    src = ("a;\n// >>> one 1: first\nb;\n// >>> two 1: inner\nc;\n// <<< two 1\n// <<< one 1\n"
           "// >>> two 2: second\nd;\n// <<< two 2\n")
    out = regions.cut(src, "two", {1: ("note",)}, {1: ("int c = 0;",)})
    assert out.splitlines() == [
        "a;", "b;", "// >>> YOUR CODE, step 1 of 2: inner", "//     note", "int c = 0;",
        "// <<< end of step 1", "// >>> YOUR CODE, step 2 of 2: second",
        "// <<< end of step 2"]


def test_reset_keeps_the_learners_work(tmp_path, monkeypatch):
    ex = write.get("naive_ds")
    monkeypatch.setattr(type(ex), "learner_file", property(lambda self: tmp_path / "x.cu"))
    path = write.reset("naive_ds")
    assert path.read_text() == write.shipped_text(ex)
    work = path.read_text().replace("// <<< end of step 1", "D = 1;\n// <<< end of step 1")
    path.write_text(work)
    with pytest.raises(FileExistsError):
        write.reset("naive_ds")
    write.reset("naive_ds", force=True)
    assert (tmp_path / "x.cu.bak1").read_text().count("D = 1;") == 1
    assert path.read_text() == write.shipped_text(ex)


def test_the_command_exits_by_status(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "ckptlab", "exercise", *args],
                              capture_output=True, text=True)

    assert run("check", "flash_forward").returncode == 3
    good = tmp_path / "good.cu"
    good.write_text(solved("naive_ds"))
    out = run("check", "naive_ds", "--file", str(good))
    assert out.returncode == 0 and out.stdout.startswith("right"), out.stdout + out.stderr
    bad = tmp_path / "bad.cu"
    bad.write_text(solved("naive_ds").replace("    D = group_sum<WARP>(D);\n", "", 1))
    out = run("check", "naive_ds", "--file", str(bad), "--hint", "2")
    assert out.returncode == 1 and "hint 2:" in out.stdout, out.stdout
    for args in (("check", "nope"), ("check", "naive_ds", "--hint", "3"),
                 ("check", "naive_ds", "--file", str(tmp_path / "missing.cu"))):
        out = run(*args)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_pytest_skips_a_shipped_file_and_fails_a_broken_one_with_the_diagnosis(tmp_path):
    """tests/test_my_kernels.py, run on a labs folder whose flash_forward.cu is a learner's
    broken kernel (the rescale of l forgotten) and whose other files are as shipped."""
    folder = tmp_path / "exercises"
    folder.mkdir()
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "checkpoint.py").write_text(
        write.get("checkpoint").solution_file.read_text())
    (folder / "scratch").mkdir()
    for name, ex in {**write.EXERCISES, **write.SCRATCH}.items():
        (folder / f"{name}{ex.learner_file.suffix}").write_text(write.shipped_text(ex))
    (folder / "flash_forward.cu").write_text(solved("flash_forward").replace(
        "l = alpha * l + group_sum<LANES>(l_tile);", "l = l + group_sum<LANES>(l_tile);", 1))
    test = device.KERNELS_DIR.parent / "tests" / "test_my_kernels.py"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                          str(test)], capture_output=True, text=True,
                         env={**os.environ, "CKPTLAB_LABS": str(tmp_path)})
    assert out.returncode == 1, out.stdout
    skipped = len(write.EXERCISES) + len(write.SCRATCH) - 1
    assert f"1 failed, {skipped} skipped" in out.stdout, out.stdout
    assert "wrong: flash_forward: O is right with a single tile" in out.stdout
    assert "not attempted: fill in labs/exercises/naive_ds.cu" in out.stdout
    assert "not attempted: fill in labs/exercises/scratch/flash_backward.cu" in out.stdout


# ---- checkpoint(): the Python exercise -------------------------------------------------------
CHECKPOINT_MISTAKES = [  # (the solution's text, the learner's, status, hint key)
    ("    with tape.no_grad():  # no op inside fn builds a node, so none saves anything\n"
     "        y = fn(x)", "    y = fn(x)", "wrong", "holds_more"),
    ("        tape.set_rng_state(rng)\n", "", "wrong", "dropout"),
    ("            x.node.add_grad(local.grad)  # adds: x may have other consumers",
     "            x.node.grad = local.grad", "wrong", "x_twice"),
    ("        local = x.detach(requires_grad=True)  # a leaf: the local graph ends here, "
     "not in x's", "        local = x", "fault", "chain"),
    ("        with tape.enable_grad(), tape.phase(\"recompute\"):",
     "        with tape.no_grad(), tape.phase(\"recompute\"):", "fault", "no_graph"),
    ("        if x.node is not None:\n"
     "            x.node.add_grad(local.grad)  # adds: x may have other consumers\n", "",
     "wrong", "no_grad_x"),
    ("        y2.backward(g)  # the parameters fn reads get their gradients here too",
     "        y2.backward(g * 2)", "wrong", "everywhere"),
]


def test_checkpoint_shipped_is_cut_from_the_solution_and_not_attempted():
    ex = write.get("checkpoint")
    assert ex.learner_file.read_text() == write.shipped_text("checkpoint")
    assert write.check("checkpoint").status == write.NOT_ATTEMPTED
    assert write.check("checkpoint", file=ex.solution_file).status == write.RIGHT


@pytest.mark.parametrize("old,new,status,pattern", CHECKPOINT_MISTAKES)
def test_a_planted_checkpoint_mistake_gets_its_diagnosis(old, new, status, pattern, tmp_path):
    sol = write.get("checkpoint").solution_file.read_text()
    assert old in sol
    path = tmp_path / "checkpoint.py"
    path.write_text(sol.replace(old, new, 1))
    report = write.check("checkpoint", file=path)
    assert (report.status, report.pattern) == (status, pattern), str(report)
    assert "hint 1: " in str(report)


def test_a_half_written_checkpoint_says_which_step_is_left(tmp_path):
    shipped = write.shipped_text("checkpoint")
    sol = write.get("checkpoint").solution_file.read_text()
    step1 = "\n".join(regions.solution_lines(sol, "checkpoint")[0][2])
    path = tmp_path / "checkpoint.py"
    path.write_text(shipped.replace(
        '    raise NotImplementedError("checkpoint: step 1 is not written yet")', step1))
    report = write.check("checkpoint", file=path)
    assert report.status == write.WRONG and "step 2 is not written yet" in str(report)


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_on_a_gpu_the_same_file_runs_through_cupy(name, tmp_path):
    """The learner's file, solved, checked on the CUDA target (CuPy's RawModule compiles it):
    every case right; the race and bounds checks are the emulator's, and the report says so."""
    path = tmp_path / f"{name}.cu"
    path.write_text(solved(name))
    report = write.check(name, file=path)
    assert report.status == write.RIGHT, str(report)
    assert "race and bounds checks run on the emulator only" in str(report)


@pytest.mark.gpu
def test_on_a_gpu_a_planted_mistake_is_diagnosed_the_same_way(tmp_path):
    report = _plant("flash_forward", "acc[c] = alpha * acc[c] + pv;", "acc[c] = acc[c] + pv;",
                    tmp_path)
    assert report.status == "wrong" and report.pattern == "multi_tile", str(report)


def test_a_file_that_is_not_source_gets_one_line(tmp_path):
    binary = tmp_path / "x.cu"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    for name in ("flash_forward", "checkpoint"):
        report = write.check(name, file=binary)
        assert report.status == NO_BUILD and "is not UTF-8 text" in str(report)
        assert len(str(report).splitlines()) == 1
    empty = tmp_path / "empty.py"
    empty.write_text("")
    assert "defines no function checkpoint" in str(write.check("checkpoint", file=empty))


@pytest.mark.slow
def test_an_endless_loop_is_stopped_by_the_watchdog_at_its_line(tmp_path):
    """The watchdog stops the thread wherever it is in the loop: the line it names is one of
    the loop's, in the learner's file (never the emulator's shim.h, whose shuffle body is
    inlined into that loop)."""
    endless = "for (int offset = WARP / 2; offset >= 0; offset /= 2) {"
    report = _plant("row_softmax", "for (int offset = WARP / 2; offset > 0; offset /= 2) {",
                    endless, tmp_path)
    assert (report.status, report.pattern) == ("fault", "watchdog"), str(report)
    lines = (tmp_path / "row_softmax.cu").read_text().splitlines()
    first = next(i for i, ln in enumerate(lines, 1) if endless in ln)
    depth, last = 0, first - 1
    while last == first - 1 or depth > 0:  # to the line that closes the loop's brace
        last += 1
        depth += lines[last - 1].count("{") - lines[last - 1].count("}")
    named = re.search(r"row_softmax\.cu:(\d+)\]", str(report))
    assert named and first <= int(named.group(1)) <= last, (first, last, str(report))
    assert re.search(rf"^\s+{named.group(1)} > ", str(report), flags=re.M), str(report)


def test_the_picture_shows_which_block_wrote_what(tmp_path):
    """--picture: the access trace of the learner's kernel drawn, here a forward that skips the
    last column group of O (never written: white in the picture, named in the message)."""
    broken = solved("flash_forward").replace(
        "for (int c = 0; c < Dt / LANES; ++c) {\n            const int col = lane + c * LANES;\n"
        "            if (col < d) O[",
        "for (int c = 0; c < Dt / LANES - 1; ++c) {\n            const int col = lane + c * LANES;"
        "\n            if (col < d) O[", 1)
    path, png = tmp_path / "ff.cu", tmp_path / "ff.png"
    path.write_text(broken)
    report = write.check("flash_forward", file=path, picture=png)
    assert report.pattern == "unwritten" and "only at c = 24..31" in str(report), str(report)
    assert f"picture: {png}" in str(report) and png.stat().st_size > 10_000
    with pytest.raises(ValueError, match="Python"):
        write.check("checkpoint", picture=png)
