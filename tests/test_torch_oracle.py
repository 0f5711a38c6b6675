"""The PyTorch oracle holds the kernels to a rule that can fail: a gradient perturbed by 1e-4
relative is rejected (by TOL), and so is one perturbed by 5e-6, under TOL, by the 2x-float32
rule, which a grown lse_slack would let through; lse_slack itself worked by hand (q = 0 makes
every score 0, so L_i = log of the keys row i sees)."""

import math

import numpy as np
import pytest
from torch_oracle import FLOOR, lse_slack, oracle, rel, rule_violation, torch

from ckptlab.torch import attention


def case(seed=3, H=2, N=17, d=16):
    g = np.random.default_rng(seed)
    return [torch.tensor(g.standard_normal((1, H, N, d)), dtype=torch.float32)
            for _ in range(4)]


def grads(fn, q, k, v, dO):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    fn(q, k, v).backward(dO)
    return q.grad, k.grad, v.grad


def perturbed(x, relative, seed=0):
    """x plus a random direction of norm `relative` * ||x||."""
    u = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed), dtype=x.dtype)
    return x + relative * float(x.norm()) * u / u.norm()


@pytest.fixture(scope="module")
def flash_dq():
    q, k, v, dO = case()
    got = grads(lambda *a: attention(*a, causal=True, method="flash"), q, k, v, dO)[0]
    truth = grads(lambda *a: oracle(*a, causal=True), *(t.double() for t in (q, k, v, dO)))[0]
    fp32 = grads(lambda *a: oracle(*a, causal=True), q, k, v, dO)[0]
    return got, truth, fp32, lse_slack(q, k, causal=True)


def test_the_kernels_gradient_passes(flash_dq):
    got, truth, fp32, slack = flash_dq
    assert rule_violation("dQ", got, truth, fp32, slack) is None


def test_a_gradient_off_by_1e4_relative_is_rejected(flash_dq):
    got, truth, fp32, slack = flash_dq
    bad = perturbed(got, 1e-4)
    assert rel(bad, truth) > 5e-5
    assert "relative error" in rule_violation("dQ", bad, truth, fp32, slack)


def test_a_gradient_off_under_tol_is_rejected_by_the_float32_rule(flash_dq):
    """5e-6 relative passes TOL = 1e-5; 2x float32's error + 2^-22 + lse_slack is ~1e-6 here.
    A slack 1000x larger, or infinite, would accept it."""
    got, truth, fp32, slack = flash_dq
    bound = 2 * rel(fp32, truth) + FLOOR + slack
    assert bound < 2e-6 and 0 < slack < 1e-6
    bad = perturbed(got, 5e-6)
    assert "2x fp32's" in rule_violation("dQ", bad, truth, fp32, slack)
    assert rule_violation("dQ", bad, truth, fp32, 1000 * slack) is None  # what it guards


@pytest.mark.parametrize("Nq,Nk,causal,keys", [(5, 7, False, 7), (7, 7, True, 7),
                                               (3, 100, True, 100), (9, 4, True, 4)])
def test_lse_slack_by_hand(Nq, Nk, causal, keys):
    """q = 0: S = 0 wherever a key is visible, L_i = log(keys row i sees); the most any row
    sees is `keys`, so the slack is 2^-23 log(keys). Rows that see none (Nq > Nk, causal)
    have no P to form and add nothing."""
    q, k = torch.zeros(1, 1, Nq, 8), torch.randn(1, 1, Nk, 8)
    assert lse_slack(q, k, causal) == pytest.approx(2.0**-23 * math.log(keys), rel=1e-12)


def test_lse_slack_of_rows_that_see_nothing_is_zero():
    q, k = torch.zeros(1, 1, 4, 8), torch.zeros(1, 1, 0, 8)
    assert lse_slack(q, k) == 0.0
