"""The Llama section of bench plan-check: its rows are what torchtitan published, compared in
torchtitan's own FLOP count (checked here: the published tokens/s times the count over the
peak gives the published MFU), none of them used to fit anything, each with its error."""

import pytest

from ckptlab.cli import bench_plan_check_llama as pcl
from ckptlab.cluster import published_llama, published_runs


def test_the_count_is_torchtitans():
    """tokens/s x (6 N + 12 L h s) / peak = the published MFU, to its rounding (the tokens/s are
    published to 3-4 digits): so the TFLOP/s compared are in the count the MFU was."""
    for r in published_llama.RUNS:
        lo, hi = ((r.tokens_per_s + e) * r.flops_per_token() / published_llama.PEAK[r.gpu] * 100
                  for e in (-0.5, 0.5))
        assert lo - 0.05 <= r.mfu_pct <= hi + 0.05
    # the embedding left out or not changes the 405B's count by 6 V h a token
    r = published_llama.RUNS[2]
    assert not r.embedding_counted and r.model.params() > 405e9


def test_rows_are_held_out_and_cited():
    names = {r.name for r in published_llama.RUNS}
    assert not names & set(published_runs.CALIBRATION)
    table = pcl.rows()
    assert len(table) == len(published_llama.RUNS) >= 1
    for row in table:
        assert row["calibration"] is False and "torchtitan's performance page" in row["source"]
        if row["fits"]:
            assert row["error"] == pytest.approx(
                row["modeled_tflops"] / row["published_tflops"] - 1)
    text = pcl.format_table(table)
    assert "held out" in text and "sources:" in text
    assert all(r["run"] in text for r in table)
