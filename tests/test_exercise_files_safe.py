"""No work lost, whatever the learner's files hold: `--picture` writes only over a picture
ckptlab drew, in the format its name says, and says so when it draws none; a reset keeps every
earlier version, numbered and git-ignored; a file that is not UTF-8, or starts with a byte-order
mark, is handled by every exercise command (`python -m ckptlab exercise ...`, run on a labs
folder of its own through CKPTLAB_LABS)."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
from exercise_labs import shipped_labs
from kernel_mistakes import MISTAKES

from ckptlab import device
from ckptlab.exercises import write
from ckptlab.exercises.write import files, regions

ROOT = device.KERNELS_DIR.parent
BOM = b"\xef\xbb\xbf"


def solved(name: str) -> str:
    ex = write.get(name)
    return regions.fill(write.shipped_text(ex), (device.KERNELS_DIR / ex.kernel).read_text(),
                        name)


def planted(name: str, index: int = 0) -> str:
    """The solved file with the exercise's `index`-th planted mistake of kernel_mistakes."""
    _, old, new, *_ = [m for m in MISTAKES if m[0] == name][index]
    return solved(name).replace(old, new, 1)


@pytest.fixture
def labs(tmp_path):
    return shipped_labs(tmp_path)


# ---- --picture -------------------------------------------------------------------------------


def test_the_picture_never_overwrites_a_file_ckptlab_did_not_draw(labs):
    folder, run = labs
    mine = folder / "exercises" / "row_softmax.cu"
    mine.write_text(solved("row_softmax"))
    before = mine.read_bytes()
    for target in (mine, folder / "notes.png"):
        if target.suffix == ".png":
            target.write_bytes(b"\x89PNG\r\n\x1a\n my own drawing")
        kept = target.read_bytes()
        out = run("check", "row_softmax", "--picture", str(target))
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out
        assert target.read_bytes() == kept, out.stderr
    assert "is not a picture ckptlab drew" in out.stderr, out.stderr
    assert mine.read_bytes() == before


@pytest.mark.slow  # three pictures drawn (seconds)
def test_the_picture_takes_the_format_its_name_says_and_may_redraw_its_own(tmp_path):
    from ckptlab.exercises.write.check import picture

    path, png = tmp_path / "row_softmax.cu", tmp_path / "who.png"
    path.write_text(solved("row_softmax"))
    for _ in range(2):  # the second time over the picture the first drew
        report = write.check("row_softmax", file=path, picture=png)
        assert report.status == "right" and f"picture: {png}" in str(report), str(report)
    assert png.read_bytes().startswith(b"\x89PNG") and files.ours(png)
    ex = write.get("row_softmax")
    for suffix, magic in ((".pdf", b"%PDF-"), (".svg", b"<?xml")):
        drawn = tmp_path / f"who{suffix}"
        picture(ex, ex.cases[0], ex.inputs(ex.cases[0]), drawn)
        assert drawn.read_bytes().startswith(magic) and files.ours(drawn)
    with pytest.raises(ValueError, match=r"\.png, \.pdf, \.svg"):
        write.check("row_softmax", file=path, picture=tmp_path / "who.jpg")
    assert not (tmp_path / "who.jpg").exists()
    assert not files.ours(path)  # the source is not a picture, whatever its bytes hold


def test_a_wrong_output_gets_a_panel_of_its_wrong_elements_beside_who_wrote_it(tmp_path):
    path, picture = tmp_path / "row_softmax.cu", tmp_path / "wrong.png"
    path.write_text(planted("row_softmax"))
    report = write.check("row_softmax", file=path, picture=picture)
    assert report.status == "wrong", str(report)
    assert "wrong elements of y" in str(report) and files.ours(picture), str(report)


def test_the_wrong_panel_marks_exactly_the_wrong_elements():
    from ckptlab import emu
    from ckptlab.measure.access_plots import plot_access_map

    ex = write.get("row_softmax")
    case = ex.cases[0]
    with emu.trace() as tr:
        y = ex.run(case, ex.inputs(case))["y"]
    bad = np.zeros(y.shape, bool)
    bad[1, 3:9] = bad[-1, -1] = True
    fig = plot_access_map(tr.last, ("y",), wrong={"y": bad})
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 2 and "wrong" in panels[1].get_title()
    assert np.array_equal(np.asarray(panels[1].images[0].get_array()) == 1, bad)


@pytest.mark.parametrize("index,status", [(5, "fault"), (None, "does not build")])
def test_a_check_that_stops_says_why_no_picture_was_drawn(index, status, tmp_path):
    text = planted("row_softmax", index) if index is not None else \
        solved("row_softmax").replace("offset /= 2) {", "offset /= 2) {{", 1)
    path, picture = tmp_path / "row_softmax.cu", tmp_path / "p.png"
    path.write_text(text)
    report = write.check("row_softmax", file=path, picture=picture)
    assert report.status == status, str(report)
    said = [ln for ln in str(report).splitlines() if ln.startswith("(no picture")]
    assert len(said) == 1 and status in said[0], str(report)
    assert not picture.exists()


# ---- reset and its backups --------------------------------------------------------------------


def test_every_reset_keeps_a_numbered_backup_byte_for_byte(labs):
    folder, run = labs
    path = folder / "exercises" / "naive_ds.cu"
    versions = [write.shipped_text("naive_ds").encode().replace(
        b"// <<< end of step 1", f"D = {k}; // caf\xe9\n// <<< end of step 1".encode("latin-1"))
        for k in range(3)]
    for k, data in enumerate(versions, 1):
        path.write_bytes(data)
        out = run("reset", "naive_ds", "--force")
        assert out.returncode == 0, out.stderr
        assert f"naive_ds.cu.bak{k}" in out.stdout, out.stdout
        assert path.read_text() == write.shipped_text("naive_ds")
    assert [(folder / "exercises" / f"naive_ds.cu.bak{k}").read_bytes()
            for k in (1, 2, 3)] == versions
    (folder / "exercises" / "naive_ds.cu.bak1").unlink()  # a gap: the next is still the newest
    path.write_bytes(versions[0])
    assert "naive_ds.cu.bak4" in run("reset", "naive_ds", "--force").stdout
    assert files.backups(path) == [path.with_name(f"naive_ds.cu.bak{k}") for k in (2, 3, 4)]


def test_a_backup_takes_the_number_after_the_largest_even_with_gaps(tmp_path):
    """Copies 2..4 deleted: the next copy is .bak6, after .bak5, so the numbers still go in the
    order the copies were made (a free low number is not reused)."""
    path = tmp_path / "row_softmax.cu"
    path.write_bytes(b"mine\n")
    for n in (1, 5):
        path.with_name(f"{path.name}.bak{n}").write_bytes(b"old %d" % n)
    assert files.backup(path).name == "row_softmax.cu.bak6"
    assert [q.name[-4:] for q in files.backups(path)] == ["bak1", "bak5", "bak6"]
    assert path.with_name("row_softmax.cu.bak5").read_bytes() == b"old 5"


def test_a_backup_never_writes_over_a_copy_that_appeared_since_the_listing(tmp_path,
                                                                          monkeypatch):
    """Another reset's copy made between the listing and the write (the listing stale): the
    copy goes to the next free number, the other one is kept."""
    path = tmp_path / "row_softmax.cu"
    path.write_bytes(b"mine\n")
    path.with_name("row_softmax.cu.bak1").write_bytes(b"the other reset's")
    monkeypatch.setattr(files, "backups", lambda p: [])
    assert files.backup(path).name == "row_softmax.cu.bak2"
    assert path.with_name("row_softmax.cu.bak1").read_bytes() == b"the other reset's"


def test_backups_are_ignored_by_git():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    for name in ("flash_forward.cu.bak1", "flash_forward.cu.bak12", "checkpoint.py.bak3"):
        out = subprocess.run(["git", "check-ignore", "-q", "--no-index",
                              f"labs/exercises/{name}"], cwd=ROOT)
        assert out.returncode == 0, name


# ---- files that are not UTF-8, or start with a byte-order mark --------------------------------


@pytest.mark.slow  # ten commands in subprocesses (seconds)
def test_every_command_handles_a_file_that_is_not_utf8(labs):
    """Latin-1 with an accent in a comment: each command answers in its own way, in one line
    where it refuses, and never with a traceback."""
    folder, run = labs
    names, kept = ("row_softmax", "checkpoint"), {}
    for name in names:
        path = folder / "exercises" / write.get(name).learner_file.name
        kept[name] = write.shipped_text(name).encode() + "# é\n".encode("latin-1")
        path.write_bytes(kept[name])
    listed = run("list")
    assert listed.returncode == 0 and not listed.stderr, listed.stderr
    state = json.loads(run("status", "--json").stdout)
    for name in names:
        assert any(line.startswith(name) and "attempted" in line and "not attempted" not in line
                   for line in listed.stdout.splitlines()), listed.stdout
        assert {e["name"]: e["state"] for e in state["exercises"]}[name] == "attempted"
        out = run("check", name)
        assert out.returncode == 1 and not out.stderr, out.stderr
        assert out.stdout.strip().count("\n") == 0 and "not UTF-8" in out.stdout, out.stdout
        assert f"line {write.shipped_text(name).count(chr(10)) + 1}" in out.stdout, out.stdout
        refused = run("reset", name)
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
        assert run("reset", name, "--force").returncode == 0
        path = folder / "exercises" / write.get(name).learner_file.name
        assert (path.parent / (path.name + ".bak1")).read_bytes() == kept[name]
        assert path.read_text() == write.shipped_text(name)
    assert run("solution", "row_softmax").returncode == 0


@pytest.mark.parametrize("name", ["row_softmax", "checkpoint"])
def test_a_file_with_a_byte_order_mark_builds_and_is_judged_on_its_text(name, tmp_path):
    path = tmp_path / write.get(name).learner_file.name
    path.write_bytes(BOM + write.shipped_text(name).encode())
    assert write.status(name, file=path) == "not attempted"
    assert write.check(name, file=path).status == "not attempted"
    body = solved(name) if name != "checkpoint" else \
        write.get("checkpoint").solution_file.read_text()
    path.write_bytes(BOM + body.encode())
    report = write.check(name, file=path)
    assert report.status == "right", str(report)
