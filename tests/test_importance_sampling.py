"""The IS correction against a direct loop over hand-built log-probs, in each of TRL's four modes."""

from __future__ import annotations

import math

import pytest
import torch

from halo_core.rl.importance import MODES, importance_ratio, ratio_stats

OLD = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-0.2, -3.0, -1.0, -1.0]])
SAMPLED = torch.tensor([[-1.5, -0.5, float("nan"), -9.0], [-0.1, -1.0, -2.0, -1.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])


def direct(mode: str, low: float | None, high: float | None) -> list[list[float]]:
    rows = []
    for old, sampled, mask in zip(OLD.tolist(), SAMPLED.tolist(), MASK.tolist()):
        diffs = [0.0 if math.isnan(s) or not m else (o - s) for o, s, m in zip(old, sampled, mask)]
        ratios = [math.exp(sum(diffs))] if mode.startswith("sequence") else [math.exp(d) for d in diffs]
        if mode.endswith("truncate"):
            ratios = [min(max(r, low if low is not None else -math.inf), high if high is not None else math.inf) for r in ratios]
        else:
            ratios = [0.0 if (low is not None and r < low) or (high is not None and r > high) else r for r in ratios]
        rows.append(ratios)
    return rows


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("low, high", [(None, 3.0), (0.5, 2.0), (None, None)])
def test_each_mode_is_the_direct_formula(mode, low, high):
    got = importance_ratio(OLD, SAMPLED, MASK, mode, low, high)
    torch.testing.assert_close(got, torch.tensor(direct(mode, low, high)), rtol=1e-6, atol=0)
    assert got.shape == ((2, 1) if mode.startswith("sequence") else (2, 4))


def test_the_logged_statistics_cover_completion_tokens_only():
    ratio = importance_ratio(OLD, SAMPLED, MASK, "token_truncate", None, None)
    stats = ratio_stats(ratio, MASK)
    kept = [r for row, m in zip(ratio.tolist(), MASK.tolist()) for r, k in zip(row, m) if k]
    assert stats == pytest.approx({"min": min(kept), "mean": sum(kept) / len(kept), "max": max(kept)})


def test_an_unknown_mode_is_refused_with_the_key():
    with pytest.raises(ValueError, match="vllm_importance_sampling_mode='token'"):
        importance_ratio(OLD, SAMPLED, MASK, "token")
