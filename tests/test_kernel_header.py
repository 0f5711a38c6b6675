"""device.kernel_header: the parts of a kernel file's header comment a lab prints (only what
matters to the lab, without an exercise's answer); a phrase it no longer finds is an error."""

import pytest

from ckptlab import device


def test_keeps_paragraphs_and_drops_lines():
    whole = device.kernel_header("softmax_rows.cu")
    assert whole == device.kernel_source("softmax_rows.cu").split("#include")[0].rstrip()
    trimmed = device.kernel_header("softmax_rows.cu", drop=("FLOP/byte",))
    assert "FLOP/byte" not in trimmed and "Pass 1" in trimmed and "Global traffic" in trimmed
    only = device.kernel_header("sgemm_tiled.cu", keep=("One block computes",))
    assert "One block computes" in only and "Global traffic" not in only
    assert only.startswith("//   A (M, K)")  # the whole paragraph, no more


def test_a_phrase_the_header_lacks_is_an_error():
    with pytest.raises(ValueError, match="none of"):
        device.kernel_header("sgemm_tiled.cu", keep=("no such words",))
    with pytest.raises(FileNotFoundError):
        device.kernel_header("nothing.cu")
