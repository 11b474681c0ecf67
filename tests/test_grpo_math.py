"""Group advantages and GRPO's loss types against direct implementations on hand-built numbers, and the
data-parallel split of each loss type adding up to one process's loss."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from halo_core.rl.advantages import NORMALIZERS, group_advantages
from halo_core.rl.losses import LOSS_TYPES, per_token_loss, reduce_loss

REWARDS = [0.0, 1.0, 1.0, 3.0, -2.0]


def direct_advantages(r: list[float], normalizer: str) -> list[float]:
    mean, median, g = sum(r) / len(r), statistics.median(r), len(r)
    if normalizer == "z_norm":
        return [(x - mean) / (statistics.stdev(r) + 1e-4) for x in r]
    if normalizer == "minmax":
        return [(x - mean) / (max(r) - min(r) + 1e-4) for x in r]
    if normalizer == "robust":
        mad = statistics.median([abs(x - median) for x in r])
        return [(x - median) / (1.4826 * mad + 1e-4) for x in r]
    ranks = [sum(y < x for y in r) + (sum(y == x for y in r) - 1) / 2 for x in r]
    return [2 * k / (g - 1) - 1 for k in ranks]


@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_each_normalizer_is_its_formula_and_a_flat_group_has_no_signal(normalizer):
    got = group_advantages(torch.tensor(REWARDS), normalizer)
    assert got.tolist() == pytest.approx(direct_advantages(REWARDS, normalizer), rel=1e-5, abs=1e-6)
    assert group_advantages(torch.tensor([2.0, 2.0, 2.0]), normalizer).tolist() == [0.0, 0.0, 0.0]


def test_quantile_norm_spans_minus_one_to_one_with_ties_sharing_a_rank():
    assert group_advantages(torch.tensor(REWARDS), "quantile_norm").tolist() == pytest.approx([-0.5, 0.25, 0.25, 1.0, -1.0])


LOGPS = torch.tensor([[-1.0, -0.5, -2.0, -0.1], [-0.3, -0.2, -0.9, -1.5], [-2.0, -1.0, -0.4, -0.6]])
OLD = LOGPS + torch.tensor([[0.1, -0.3, 0.0, 0.5], [0.0, 0.4, -0.2, 0.0], [0.3, 0.0, 0.0, -0.1]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
ADV = torch.tensor([0.7, -1.2, 0.4])


def direct_loss(loss_type: str, eps: float = 0.2, max_len: int = 4) -> float:
    rows = []
    for logps, old, mask, a in zip(LOGPS.tolist(), OLD.tolist(), MASK.tolist(), ADV.tolist()):
        terms = []
        for lp, o, m in zip(logps, old, mask):
            ratio = math.exp(lp - o)
            terms.append((-min(ratio * a, min(max(ratio, 1 - eps), 1 + eps) * a), m))
        rows.append(terms)
    if loss_type == "grpo":
        return sum(sum(t * m for t, m in row) / sum(m for _, m in row) for row in rows) / len(rows)
    total = sum(t * m for row in rows for t, m in row)
    if loss_type == "bnpo":
        return total / sum(m for row in rows for _, m in row)
    return total / (len(rows) * max_len)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_each_loss_type_is_the_direct_formula(loss_type):
    loss = per_token_loss(LOGPS, ADV, OLD)
    got = reduce_loss(loss, MASK, loss_type, sequences=3, tokens=int(MASK.sum()), max_completion_length=4)
    assert got.item() == pytest.approx(direct_loss(loss_type), rel=1e-5)  # float32 against float64


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_two_ranks_shares_add_up_to_one_process(loss_type):
    """Rows of different lengths on each "rank" (row 0 on one, rows 1-2 on the other): the shares sum to the whole."""
    whole = reduce_loss(per_token_loss(LOGPS, ADV, OLD), MASK, loss_type, sequences=3, tokens=int(MASK.sum()), max_completion_length=4)
    parts = [reduce_loss(per_token_loss(LOGPS[s], ADV[s], OLD[s]), MASK[s], loss_type, sequences=3, tokens=int(MASK.sum()), max_completion_length=4)
             for s in (slice(0, 1), slice(1, 3))]
    assert (parts[0] + parts[1]).item() == pytest.approx(whole.item(), rel=1e-6)


def test_one_update_per_batch_has_the_policy_gradient():
    """No old pass: ρ = 1, so the gradient of the grpo loss is -A ∇logp averaged per sequence."""
    logps = LOGPS.clone().requires_grad_(True)
    reduce_loss(per_token_loss(logps, ADV), MASK, "grpo", sequences=3, tokens=int(MASK.sum())).backward()
    expected = -ADV.reshape(-1, 1) * MASK / MASK.sum(-1, keepdim=True) / 3
    torch.testing.assert_close(logps.grad, expected)
