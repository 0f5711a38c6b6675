"""bench/fa_grid.py (FlashAttention's accuracy grid through ckptlab.torch.flash_attn_func) can
tell a miss from a pass: one case of its grid passes, and the same case with out nudged by
2%, or with a reference run without the decoded dropout mask, misses."""

import importlib.util
from pathlib import Path

from torch_oracle import torch  # skips this module without PyTorch

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "fa_grid.py"


def load():
    spec = importlib.util.spec_from_file_location("fa_grid", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_grid_case_passes_and_a_nudged_kernel_misses(monkeypatch):
    fa_grid = load()
    case = (torch.float16, 40, 37, 50, True, 0.17, 1, (2, 1))
    assert fa_grid.run_case(*case) == []
    real = fa_grid.flash_attn_func

    def nudged(*args, **kwargs):
        out, lse, S_dmask = real(*args, **kwargs)
        return out * (1 + 2e-2), lse, S_dmask

    monkeypatch.setattr(fa_grid, "flash_attn_func", nudged)
    assert [name for name, _ in fa_grid.run_case(*case)][:1] == ["out"]
    monkeypatch.setattr(fa_grid, "flash_attn_func", real)
    monkeypatch.setattr(fa_grid, "reference",
                        lambda q, k, v, c, mask, p, dtype, f=fa_grid.reference:
                        f(q, k, v, c, None, 0.0, dtype))
    assert "out" in [name for name, _ in fa_grid.run_case(*case)]
