"""Truncated importance sampling against the rollout engine's log-probs, with ``trl.GRPOConfig``'s semantics.

TRL applies it only to its own vLLM rollouts (``vllm_importance_sampling_*``, inline in ``GRPOTrainer``); Halo's
engines (the in-process ``hf`` one, server engines) produce their own per-token log-probs, so the same
correction is a function here: the ratio of the training policy's (old) log-probs to the sampler's, per token or
per sequence, truncated to ``[clip_min, clip_max]`` or masked to zero outside it.
"""

from __future__ import annotations

import math

import torch

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def importance_ratio(old_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor, mode: str = "sequence_mask",
                     clip_min: float | None = None, clip_max: float | None = 3.0) -> torch.Tensor:
    """``(B, T)`` per-token or ``(B, 1)`` per-sequence ratios ``exp(old - sampling)`` over the completion ``mask``.

    A token whose sampling log-prob is NaN (an engine that did not return it) counts as ratio 1.
    """
    if mode not in MODES:
        raise ValueError(f"vllm_importance_sampling_mode={mode!r}; choose one of {list(MODES)}")
    diff = torch.nan_to_num((old_logps - sampling_logps) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return ratio if clip_min is None and clip_max is None else torch.clamp(ratio, min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def ratio_stats(ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """min / mean / max of the ratios that apply (per-token ratios on completion tokens; per-sequence all), as logged."""
    values = ratio[mask.bool()] if ratio.shape == mask.shape else ratio.flatten()
    if values.numel() == 0:
        return {"min": 0.0, "mean": 0.0, "max": 0.0}
    return {"min": values.min().item(), "mean": values.mean().item(), "max": values.max().item()}
