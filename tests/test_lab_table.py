"""bench/lab_table.py's counts without running a notebook: which sections count as ideas, and
which outputs count as text (stream text and text/plain, in UTF-8 bytes) or as images."""

import importlib.util
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (requirements-dev)")
_spec = importlib.util.spec_from_file_location(  # bench/ is not a package
    "lab_table", Path(__file__).resolve().parent.parent / "bench" / "lab_table.py")
lab_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lab_table)
v4 = nbformat.v4


def test_the_template_frame_is_not_an_idea():
    heads = ["1. Motivation: two roofs", "2. The kernels", "3. Check it", "4. Measure it: half the "
             "bytes", "5. What it means", "6. Write it yourself: the softmax", "1. HFU and MFU",
             "3. Count them", "4. Check them"]
    nb = v4.new_notebook(cells=[v4.new_markdown_cell("\n".join(f"## {h}" for h in heads[:4])),
                                v4.new_markdown_cell("text\n### 2.1 Not a section\n"
                                                     + "\n".join(f"## {h}" for h in heads[4:]))])
    assert lab_table.sections(nb) == heads
    assert lab_table.ideas(nb) == ["2. The kernels", "4. Measure it: half the bytes",
                                   "1. HFU and MFU"]


def test_text_is_counted_in_bytes_and_images_apart():
    cell = v4.new_code_cell("x", outputs=[
        v4.new_output("stream", name="stdout", text="é\n"),  # 3 bytes: é is 2 in UTF-8
        v4.new_output("execute_result", data={"text/plain": "1234"}, execution_count=1),  # 4
        v4.new_output("display_data", data={"image/png": "A" * 500, "text/plain": "<Fig>",  # 5
                                            "text/html": "<b>7</b>"})])  # 8, other text
    md = v4.new_markdown_cell("## not an output")
    # 3 + 4 + 5 = 12 bytes of text, one image, 8 bytes of other text
    assert lab_table.outputs(v4.new_notebook(cells=[md, cell])) == (12, 1, 8)
