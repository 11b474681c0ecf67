"""The importance-sampling correction as the grpo trainer applies it to a rollout engine's log-probs (TRL's own
``vllm_importance_sampling_*`` code, its gate opened for Halo's engines) against a direct loop, in each of
TRL's four modes, for an engine whose log-probs are stale (perturbed) and one NaN (a token it could not score)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from launch_kit import TINY, uneven_rows

TESTS = Path(__file__).resolve().parent
MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def direct(old, sampled, mask, mode: str, low: float | None, high: float | None) -> list[list[float]]:
    rows = []
    for o_row, s_row, m_row in zip(old.tolist(), sampled.tolist(), mask.tolist()):
        diffs = [0.0 if math.isnan(s) or not m else (o - s) for o, s, m in zip(o_row, s_row, m_row)]
        ratios = [math.exp(sum(diffs))] if mode.startswith("sequence") else [math.exp(d) for d in diffs]
        if mode.endswith("truncate"):
            ratios = [min(max(r, low if low is not None else -math.inf), high if high is not None else math.inf) for r in ratios]
        else:
            ratios = [0.0 if (low is not None and r < low) or (high is not None and r > high) else r for r in ratios]
        rows.append(ratios)
    return rows


class _Stale:
    """The engine's rollouts with log-probs off by up to +-0.3 (a lagging or different sampler), one of them NaN."""

    def __init__(self, engine):
        self.engine, self.shares_weights = engine, True

    def generate(self, prompts, params, seeds=None):
        rollout = self.engine.generate(prompts, params)
        draw = torch.Generator().manual_seed(1)
        rollout.logprobs = [[lp + 0.6 * (float(torch.rand((), generator=draw)) - 0.5) for lp in row] for row in rollout.logprobs]
        rollout.logprobs[0][0] = float("nan")
        return rollout


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("low, high", [(None, 3.0), (0.8, 1.1)])
def test_the_trainers_ratio_is_the_direct_formula(tmp_path, mode, low, high):
    import datasets
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from halo_core.methods.grpo import HaloGRPOConfig, HaloGRPOTrainer

    sys.path.insert(0, str(TESTS))
    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY), dtype=torch.float32)
    args = HaloGRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=1, save_strategy="no", bf16=False,
                          report_to="none", use_cpu=True, num_generations=2, max_completion_length=6, reward_funcs=["grpo_rewards.token_sum"],
                          vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_min=low, vllm_importance_sampling_clip_max=high)
    rows = uneven_rows("prompts")[:2]
    trainer = HaloGRPOTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows),
                              processing_class=AutoTokenizer.from_pretrained(TINY))
    trainer._halo_rollouts.engine = _Stale(trainer._halo_rollouts.engine)
    out = trainer._generate_and_score_completions([row for row in rows for _ in range(2)])
    mask = out["completion_mask"]
    expected = direct(out["old_per_token_logps"], out["sampling_per_token_logps"], mask, mode, low, high)
    ratio = out["importance_sampling_ratio"]
    got = ratio.tolist() if mode.startswith("sequence") else (ratio * mask).tolist()
    if not mode.startswith("sequence"):
        expected = [[r * m for r, m in zip(row, m_row)] for row, m_row in zip(expected, mask.tolist())]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-5, atol=1e-6)
    assert any(r not in (0.0, 1.0) for row in expected for r in row)  # the correction does something
    logged = trainer._metrics["train"]["sampling/importance_sampling_ratio/mean"]
    assert len(logged) == 1 and math.isfinite(logged[0])
