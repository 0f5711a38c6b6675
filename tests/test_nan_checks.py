"""A comparison that decides pass or fail treats a NaN as a failure: `abs(a - b) > tol` is
False for NaN, so a check written that way passes a NaN. The DDP and FSDP demos' loss checks,
the tensor-parallel block's check and FlashAttention's accuracy grid (bench/fa_grid.py) each
fail on a NaN here."""

import importlib.util
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "fa_grid.py"


def ddp_result(losses, ref):
    rank = dict(rank=0, losses=losses, peaks=[10] * len(losses), predicted=10, plan="[0]",
                device="cpu")
    return dict(nproc=2, ranks=[rank], reference=dict(losses=ref),
                config=dict(layers=1, width=8, heads=1, seq=4, batch=2, attn="flash",
                            schedule="none"), backend="gloo")


@pytest.mark.parametrize("losses,ref", [
    ([1.0, math.nan], [1.0, math.nan]),   # both diverged: equal, but not a pass
    ([1.0, math.nan], [1.0, 0.9]),
    ([1.0, 0.9], [1.0, math.nan]),
    ([math.inf, 1.0], [math.inf, 1.0]),
])
def test_the_ddp_check_fails_a_loss_that_is_not_finite(torch, losses, ref):
    from ckptlab.torch import demo

    bad = demo.check_ddp(ddp_result(losses, ref))
    assert len(bad) == 1 and "not a finite number" in bad[0], bad


@pytest.mark.parametrize("losses,ref", [
    ([1.0, math.nan], [1.0, math.nan]),
    ([1.0, math.nan], [1.0, 0.9]),
    ([math.inf, 1.0], [math.inf, 1.0]),
])
def test_the_fsdp_check_fails_a_loss_that_is_not_finite(torch, losses, ref):
    from ckptlab.torch import fsdp

    rank = dict(rank=1, losses=losses, saved=[10] * len(losses), predicted=10)
    bad = fsdp.check(dict(ranks=[rank], reference=dict(losses=ref)))
    assert len(bad) == 1 and "not a finite number" in bad[0] and "rank 1" in bad[0], bad
    assert fsdp.check(dict(ranks=[dict(rank, losses=[1.0, 0.9])],
                           reference=dict(losses=[1.0, 0.9]))) == []


def test_the_ddp_check_still_passes_equal_finite_losses_and_fails_a_gap(torch):
    from ckptlab.torch import demo

    assert demo.check_ddp(ddp_result([1.0, 0.9], [1.0, 0.9])) == []
    assert len(demo.check_ddp(ddp_result([1.0, 0.9], [1.0, 0.8]))) == 1
    assert demo.check_ddp(ddp_result([0.0], [0.0])) == []


def test_the_tensor_parallel_check_fails_a_nan_output(torch):
    from ckptlab.torch import tensor_parallel as tp

    shape = tp.Shape(s=5, b=1, h=8, a=2)
    ref = tp.measure(0, 1, shape)
    assert tp.check([ref], ref, shape) == []
    spoiled = {name: {**r, "y": torch.full_like(r["y"], math.nan)} if name == "full" else r
               for name, r in ref.items()}
    bad = tp.check([spoiled], ref, shape)
    assert bad == ["rank 0 full y: error nan"], bad


def test_the_accuracy_grid_counts_a_nan_output_as_a_miss(torch, monkeypatch):
    spec = importlib.util.spec_from_file_location("fa_grid", SCRIPT)
    fa_grid = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fa_grid)
    case = (torch.float16, 16, 9, 12, False, 0.0, 1, (1, 1))
    real = fa_grid.flash_attn_func

    def nan_out(*args, **kwargs):
        out, lse, S_dmask = real(*args, **kwargs)
        return out * math.nan, lse, S_dmask

    monkeypatch.setattr(fa_grid, "flash_attn_func", nan_out)
    assert "out" in [name for name, _ in fa_grid.run_case(*case)]
