"""The roofline against hand computations, and the spec table's completeness and sources."""

import math
import re

import numpy as np
import pytest

from ckptlab.measure import roofline

FIELDS = ("fp32_flops", "tensor16_flops", "hbm_bytes_per_s", "l2_bytes", "smem_per_sm_bytes",
          "sms", "arch")


def test_every_device_has_every_number_with_a_source():
    assert {"A100-SXM4-80GB", "H100-SXM5-80GB", "H200-SXM-141GB", "L4", "RTX-4090", "T4", "A10",
            "RTX-3090"} <= set(roofline.SPECS)
    for name, entry in roofline.SPECS.items():
        for field in FIELDS:
            if field == "arch":  # the compute capability ptxas compiles for: sm_80, sm_90...
                assert re.fullmatch(r"sm_\d\d", entry[field]), (name, entry[field])
            else:
                assert entry[field] > 0, (name, field)
            assert "http" in entry["sources"][field], (name, field)
        # tensor cores beat CUDA cores on every part here, and no part has more L2 than 100 MiB
        assert entry["tensor16_flops"] > entry["fp32_flops"], name
        assert entry["l2_bytes"] < 100 * roofline.MIB, name


def test_aliases_and_lookup():
    assert roofline.spec("a100")["name"] == "A100-SXM4-80GB"
    assert roofline.spec("H200")["hbm_bytes_per_s"] == 4.8e12
    assert roofline.spec("RTX-4090")["l2_bytes"] == 75497472  # device query: 75497472 bytes
    # the H200 reports 60 MB of L2 and has 132 SMs (docs/references.md)
    assert roofline.spec("h200")["l2_bytes"] == 60 * roofline.MIB
    assert roofline.spec("h200")["sms"] == roofline.spec("h100")["sms"] == 132
    assert roofline.spec("a100")["sms"] == 108
    with pytest.raises(ValueError, match="unknown device"):
        roofline.spec("V100")
    # the GPUs learners have: a free T4 (sm_75, no bf16), an A10 and an RTX 3090 (sm_86)
    t4 = roofline.spec("t4")
    assert (t4["arch"], t4["sms"], t4["hbm_bytes_per_s"]) == ("sm_75", 40, 320e9)
    assert roofline.ridge_point("t4") == pytest.approx(8.1e12 / 320e9)
    assert roofline.spec("3090")["arch"] == roofline.spec("a10")["arch"] == "sm_86"
    assert roofline.spec("rtx3090")["tensor16_flops"] == 71e12  # FP32 accumulate, dense
    with pytest.raises(TypeError, match="device name"):
        roofline.spec(3)


def test_a100_fp32_by_hand():
    # A100 SXM 80GB, fp32: peak 19.5e12 FLOP/s, bandwidth 2.039e12 B/s.
    # ridge = 19.5e12 / 2.039e12 = 9.5635 FLOP/byte.
    # A kernel of 1e9 FLOPs and 1e8 bytes: I = 10 FLOP/byte, just right of the ridge, so
    # compute-bound: t = 1e9 / 19.5e12 = 51.282 us (memory alone: 1e8 / 2.039e12 = 49.044 us).
    assert roofline.ridge_point("a100", "fp32") == pytest.approx(9.56351152, rel=1e-8)
    assert roofline.arithmetic_intensity(1e9, 1e8) == 10.0
    t = roofline.modeled_time(1e9, 1e8, "a100", "fp32")
    assert t.bound == "compute"
    assert t.seconds == pytest.approx(51.2820513e-6, rel=1e-8)
    assert t.memory_s == pytest.approx(49.0436488e-6, rel=1e-8)
    assert t.source == "modeled" and t.device == "A100-SXM4-80GB"
    # Ten times the bytes (I = 1): memory-bound, t = 1e9 / 2.039e12 = 490.44 us.
    t = roofline.modeled_time(1e9, 1e9, "a100", "fp32")
    assert t.bound == "memory"
    assert t.seconds == pytest.approx(490.436488e-6, rel=1e-8)
    # The roof: I = 1 -> 2.039e12 FLOP/s (bandwidth-limited); I = 100 -> the 19.5e12 peak.
    assert roofline.attainable_flops(1.0, "a100") == pytest.approx(2.039e12)
    assert roofline.attainable_flops(100.0, "a100") == 19.5e12


def test_flashattention_fig2_on_a100_by_hand():
    # FA1 paper Fig. 2 (docs/references.md): the published 66.6 / 75.2 GFLOPs are one head's,
    # N^2 B (12 d + 224) and N^2 B (14 d + 224) at N = 1024, d = 64, B = 64 (no factor H = 16),
    # with ~224 non-matmul FLOPs per score; the author's correction (flash-attention issue #741)
    # counts the matmuls over all heads: 12 d N^2 B H = 824.6 and 14 d N^2 B H = 962.1 GFLOPs.
    n2b = 1024**2 * 64
    assert n2b * (12 * 64 + 224) / 1e9 == pytest.approx(66.6, abs=0.05)
    assert n2b * (14 * 64 + 224) / 1e9 == pytest.approx(75.2, abs=0.05)
    assert 12 * 64 * n2b * 16 / 1e9 == pytest.approx(825, abs=0.5)
    assert 14 * 64 * n2b * 16 / 1e9 == pytest.approx(963, abs=1)
    # On the A100 fp16 roofline (312e12 FLOP/s, 2.039e12 B/s), with the paper's DRAM bytes:
    # standard: 825 GFLOPs, 40.3 GB -> compute 2.644 ms, memory 19.765 ms: memory-bound.
    # flash:    963 GFLOPs,  4.4 GB -> compute 3.087 ms, memory  2.158 ms: compute-bound.
    std = roofline.modeled_time(825e9, 40.3e9, "a100", "fp16")
    fla = roofline.modeled_time(963e9, 4.4e9, "a100", "fp16")
    assert (std.bound, fla.bound) == ("memory", "compute")
    assert std.seconds == pytest.approx(19.7646e-3, rel=1e-4)
    assert fla.seconds == pytest.approx(3.08654e-3, rel=1e-4)
    # The modeled speed-up is 6.4x, not the byte ratio 9.2x: flash's extra FLOPs are not free
    # once it is compute-bound. The paper measured 5.7x (41.7 ms vs 7.3 ms); the model, a lower
    # bound on time, sits below both measurements.
    assert std.seconds / fla.seconds == pytest.approx(6.404, abs=0.001)
    assert std.seconds < 41.7e-3 and fla.seconds < 7.3e-3
    # With the published one-head FLOPs the roofline would call both memory-bound (wrongly).
    assert roofline.modeled_time(75.2e9, 4.4e9, "a100", "fp16").bound == "memory"


def test_dtype_picks_the_right_peak():
    assert roofline.peak_flops("h100", "bf16") == roofline.peak_flops("h100", np.float16)
    assert roofline.peak_flops("h100", "fp32") == 67e12
    assert roofline.ridge_point("h200", "bf16") == pytest.approx(989.5e12 / 4.8e12)
    with pytest.raises(ValueError, match="dtype"):
        roofline.peak_flops("h100", "fp8")


def test_utilization_is_mfu_or_hfu():
    # 9.75e12 FLOPs in one second on an A100 in fp32 is half of the 19.5e12 peak.
    assert roofline.utilization(9.75e12, 1.0, "a100") == pytest.approx(0.5)
    # Recompute FLOPs raise HFU above MFU for the same time: 1.33x the FLOPs, 1.33x the ratio.
    mfu = roofline.utilization(3e12, 0.5, "l4", "bf16")
    hfu = roofline.utilization(4e12, 0.5, "l4", "bf16")
    assert hfu / mfu == pytest.approx(4 / 3)


def test_bad_numbers_are_refused():
    with pytest.raises(ValueError, match="bytes_moved"):
        roofline.arithmetic_intensity(1e9, 0)
    with pytest.raises(ValueError, match="flops"):
        roofline.modeled_time(-1, 10, "a100")
    with pytest.raises(ValueError, match="flops"):
        roofline.modeled_time(math.nan, 10, "a100")
    with pytest.raises(TypeError, match="flops"):
        roofline.modeled_time("1e9", 10, "a100")
    with pytest.raises(ValueError, match="seconds"):
        roofline.utilization(1e9, 0.0, "a100")
