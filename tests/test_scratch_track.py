"""The from-scratch track (ckptlab.exercises.write.scratch): labs/exercises/scratch/NAME.cu is
the package's template, shipped it is "not attempted" and builds in every instantiation the
wrappers launch, it holds no line of the kernels' bodies, and with the lab's own kernel bodies
written into it it is right; a mistake in it gets the guided exercise's diagnosis; reset, the
command line (the name scratch/NAME, or the guided name with --file) and the API agree."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from ckptlab import device
from ckptlab.exercises import write
from ckptlab.exercises.write import regions, scratch
from ckptlab.exercises.write.check import check as guided_check
from ckptlab.kernels import nvrtc, table

NAMES = list(write.SCRATCH)


def kernel_source(name: str) -> str:
    return (device.KERNELS_DIR / write.get(name).kernel).read_text()


def filled(name: str) -> str:
    """The scratch file with every YOUR CODE block holding the lab's own kernel body."""
    return scratch.fill(write.shipped_text(name), kernel_source(name))


def _tokens(source: str) -> list[str]:
    """The code of a CUDA file, comments and layout aside."""
    return " ".join(line.split("//")[0] for line in source.splitlines()).split()


def _write(tmp_path, name, text):
    path = tmp_path / f"{name.removeprefix('scratch/')}.cu"
    path.write_text(text)
    return path


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "ckptlab", "exercise", *args],
                          capture_output=True, text=True)


@pytest.mark.parametrize("name", NAMES)
def test_the_tracked_file_is_the_packages_template(name):
    ex = write.get(name)
    assert ex.learner_file == write.EXERCISE_DIR / "scratch" / f"{name[len('scratch/'):]}.cu"
    assert ex.learner_file.read_text() == write.shipped_text(name) == \
        scratch.template(ex).read_text(), (
        f"{ex.learner_file} differs from {scratch.template(ex)}: the template is the source; "
        f"write.reset({name!r}, force=True) copies it")


@pytest.mark.parametrize("name", NAMES)
def test_with_the_labs_bodies_written_in_it_is_the_labs_kernel(name):
    """Filled with the kernels' bodies, the scratch file is the kernel file, comments and layout
    aside: the given signatures, shared memory, helpers and given kernels are the lab's own, so
    the wrappers launch it as they launch kernels/."""
    assert _tokens(filled(name)) == _tokens(kernel_source(name))


@pytest.mark.parametrize("name", NAMES)
def test_the_shipped_file_holds_no_line_of_a_body_it_asks_for(name):
    shipped = write.shipped_text(name)
    asked = {scratch.BODY_TITLE.match(s.title)["kernel"] for s in regions.steps(shipped)}
    bodies = scratch.kernel_bodies(kernel_source(name))
    assert asked and asked <= set(bodies)
    given = [ln for ln in shipped.splitlines()]
    for kernel in asked:
        for line in bodies[kernel]:
            code = " ".join(line.split("//")[0].split())
            if len(code) > 12:
                assert not any(code in " ".join(g.split()) for g in given), (kernel, code)


@pytest.mark.parametrize("name", NAMES)
def test_shipped_it_is_not_attempted(name):
    report = write.check(name)
    assert report.status == write.NOT_ATTEMPTED, str(report)
    assert f"fill in labs/exercises/{name}.cu" in str(report)
    assert write.status(name) == write.NOT_ATTEMPTED
    # the guided name with --file is the same check: not "wrong" against the guided file
    guided = name.removeprefix("scratch/")
    assert str(write.check(guided, file=write.get(name).learner_file)) == str(report)
    assert write.status(guided, file=write.get(name).learner_file) == write.NOT_ATTEMPTED


def _compiled(name, instantiations, tmp_path) -> set:
    """Compile the shipped scratch file with NVRTC for sm_80 under the kernel file's name (the
    name the instantiation table keys on); the kernels ptxas reports."""
    for header in device.KERNELS_DIR.glob("*.cuh"):
        shutil.copy(header, tmp_path)
    path = tmp_path / write.get(name).kernel
    path.write_text(write.shipped_text(name))
    records = nvrtc.compile_records(path, "sm_80", "nvrtc", instantiations)
    return {r["kernel"] for r in records if r["kind"] == "kernel"}


def _check_tiles(name) -> list[str]:
    """The instantiations the check launches (its 16 x 16 tiles, tile head dim 32)."""
    if name == "scratch/flash_forward":
        return [table.fwd_name(32, 16, 16, s) for s in (False, True)]
    if name == "scratch/flash_backward":
        return ([table.dkdv_name(32, 16, 16, det, s) for det in (False, True)
                 for s in (False, True)] + [table.dq_name(32, 16, 16, s) for s in (False, True)])
    return []


def _extern_c(name) -> list[str]:
    return re.findall(r'extern "C" __global__ void (\w+)\(', write.shipped_text(name))


@pytest.mark.parametrize("name", NAMES)
def test_shipped_every_instantiation_builds_with_nvrtc(name, tmp_path):
    """Every kernel and every instantiation the wrappers launch (every tile head dim, flash and
    stored, both dQ modes) and the check's own compile from the file as shipped."""
    want = table.instantiations(write.get(name).kernel) + _check_tiles(name)
    got = _compiled(name, want, tmp_path)
    assert got == set(want + _extern_c(name)), sorted(got ^ set(want + _extern_c(name)))


@pytest.mark.parametrize("tile_dims", [(32,), pytest.param(table.TILE_HEAD_DIMS,
                                                            marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", NAMES)
def test_shipped_builds_on_the_emulator(name, tile_dims):
    ex = write.get(name)
    names = table.instantiations(ex.kernel, tile_dims) + _check_tiles(name)
    with device.use("emu"), device.kernel_file(ex.kernel, write.shipped_text(name)):
        module = device.load(ex.kernel, name_expressions=tuple(names) or None)
        for n in names + _extern_c(name):
            module.get_function(n)


@pytest.mark.parametrize("name", NAMES)
def test_with_the_labs_bodies_it_is_right(name, tmp_path):
    report = write.check(name, file=_write(tmp_path, name, filled(name)))
    assert report.status == write.RIGHT, str(report)
    assert "the same bytes as the shipped kernel" in str(report), str(report)


@pytest.mark.counted
@pytest.mark.parametrize("name,old,new,output", [
    ("scratch/flash_forward", "l = alpha * l + group_sum<LANES>(l_tile);",
     "l = l + group_sum<LANES>(l_tile);", "O"),
    ("scratch/flash_backward", "dk[c] += sk;", "dk[c] = sk;", "dK"),
])
def test_a_mistake_gets_the_guided_diagnosis_without_a_step_it_lacks(name, old, new, output,
                                                                      tmp_path):
    text = filled(name)
    assert old in text
    path = _write(tmp_path, name, text.replace(old, new, 1))
    report = write.check(name, file=path, hint=2)
    shown = str(report)
    assert report.status == write.WRONG and report.finding.output == output, shown
    assert shown.startswith(f"wrong: {name}: {output} "), shown
    # the guided hint 2 opens with the guided step it is about ("Step 3: ..."): not here
    guided = str(guided_check(write.get(name.removeprefix("scratch/")), path, hint=2))
    assert re.search(r"^hint 2: Steps? \d", guided, flags=re.M), guided
    hints = [ln for ln in shown.splitlines() if ln.startswith("hint 2: ")]
    assert hints and not re.match(r"hint 2: Steps? \d", hints[0]), shown
    assert hints[0] in re.sub(r"^hint 2: Steps? [\d, and-]+: ", "hint 2: ", guided, flags=re.M)


def test_all_cases_right_with_a_body_left_as_shipped_is_not_right(tmp_path):
    """A file whose attn_flash_bwd_dq is still as shipped is not "right": the deterministic
    instantiation's cases find dQ unwritten, and the report says which body is as shipped."""
    shipped = write.shipped_text("scratch/flash_backward")
    dkdv = scratch.kernel_bodies(kernel_source("scratch/flash_backward"))["attn_flash_bwd_dkdv"]
    lines = shipped.splitlines()
    at = next(n for n, ln in enumerate(lines) if "<<< end of step 1" in ln)
    path = _write(tmp_path, "scratch/flash_backward", "\n".join(lines[:at] + dkdv + lines[at:]))
    report = write.check("scratch/flash_backward", file=path)
    assert report.status == write.WRONG, str(report)
    assert "deterministic" in str(report) and "step 2 is still as shipped" in str(report), \
        str(report)


def test_reset_restores_the_shipped_file_and_keeps_the_work(tmp_path, monkeypatch):
    ex = write.get("scratch/flash_forward")
    monkeypatch.setattr(type(ex), "learner_file",
                        property(lambda self: tmp_path / f"{self.name}.cu"))
    path = write.reset("scratch/flash_forward")
    assert path == tmp_path / "scratch" / "flash_forward.cu"
    assert path.read_text() == write.shipped_text(ex)
    path.write_text(filled("scratch/flash_forward"))
    assert write.status("scratch/flash_forward") == "attempted"
    with pytest.raises(FileExistsError):
        write.reset("scratch/flash_forward")
    write.reset("scratch/flash_forward", force=True)
    assert path.read_text() == write.shipped_text(ex)
    assert write.status("scratch/flash_forward") == write.NOT_ATTEMPTED
    kept = [p for p in path.parent.iterdir() if p != path]  # the backup, however it is named
    assert any(p.read_text() == filled("scratch/flash_forward") for p in kept), kept


@pytest.mark.slow  # commands in subprocesses (seconds)
def test_the_command_line_agrees_with_the_api(tmp_path):
    name = "scratch/flash_forward"
    shipped = _cli("check", name)
    assert shipped.returncode == 3 and shipped.stdout.strip() == str(write.check(name))
    path = _write(tmp_path, name, filled(name))
    short = _cli("check", name, "--file", str(path))
    long = _cli("check", "flash_forward", "--file", str(path))
    assert short.returncode == long.returncode == 0, short.stdout + short.stderr
    assert short.stdout == long.stdout
    assert short.stdout.strip() == str(write.check(name, file=path))
    listed = _cli("list").stdout
    assert re.search(r"^scratch/flash_forward\s+04\s+labs/exercises/scratch/flash_forward\.cu"
                     r"\s+not attempted", listed, flags=re.M), listed
    assert _cli("check", "scratch/nope").returncode == 2


def test_the_solution_shows_the_bodies():
    text = write.solution("scratch/flash_backward")
    assert "step 1: the body of attn_flash_bwd_dkdv" in text
    assert "step 2: the body of attn_flash_bwd_dq" in text
    assert "attn_flash_bwd_preprocess" not in text  # given, not written


@pytest.mark.parametrize("lab,module", [("04_flash_forward", "lab04"),
                                        ("05_recompute_backward", "lab05")])
def test_the_labs_cell_shows_a_shipped_file_as_not_attempted(lab, module):
    """The cell after the guided exercise of labs 04 and 05 checks the scratch file: run as
    stored (answer = ...), it says "not attempted"."""
    import importlib
    import json

    path = device.KERNELS_DIR.parent / "labs" / f"{lab}.ipynb"
    cells = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]
             if c["cell_type"] == "code"]
    cell = next(c for c in cells if 'write_kernel("scratch/' in c)
    *body, last = cell.splitlines()
    ns = {"exercise": importlib.import_module(f"ckptlab.exercises.{module}")}
    exec("\n".join(body), ns)  # noqa: S102 (the lab's own cell)
    assert str(eval(last, ns)).startswith("not attempted: fill in labs/exercises/scratch/")


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_on_a_gpu_the_filled_file_runs_through_cupy(name, tmp_path):
    report = write.check(name, file=_write(tmp_path, name, filled(name)))
    assert report.status == write.RIGHT, str(report)
    assert "race and bounds checks run on the emulator only" in str(report)
