"""Group advantages from rewards, computed once per group (offline GRPO: at tokenisation).

Each normaliser maps one group's rewards ``r`` (its completions of one prompt) to advantages:

- ``z_norm``: ``(r - mean) / (std + eps)``, ``std`` with Bessel's correction (TRL's ``scale_rewards="group"``).
- ``quantile_norm``: each reward's mid-rank quantile in its group mapped onto ``[-1, 1]``,
  ``2 * (rank - 1 + (ties - 1) / 2) / (G - 1) - 1`` (ties share their mean rank); blind to the rewards' scale
  and outliers.
- ``minmax``: ``(r - mean) / (max - min + eps)``.
- ``robust``: ``(r - median) / (1.4826 * MAD + eps)`` (the median absolute deviation, scaled to a normal's std).

A group whose rewards are all equal gets zero advantages under every normaliser (it carries no signal).
"""

from __future__ import annotations

import torch

NORMALIZERS = ("z_norm", "quantile_norm", "minmax", "robust")
EPS = 1e-4


def group_advantages(rewards: torch.Tensor, normalizer: str = "quantile_norm") -> torch.Tensor:
    """``rewards`` [G] of one group -> advantages [G] (float32)."""
    if normalizer not in NORMALIZERS:
        raise ValueError(f"advantage_normalizer={normalizer!r}; choose one of {list(NORMALIZERS)}")
    r = rewards.to(torch.float32)
    if r.numel() < 2 or bool((r == r[0]).all()):
        return torch.zeros_like(r)
    if normalizer == "z_norm":
        return (r - r.mean()) / (r.std() + EPS)
    if normalizer == "minmax":
        return (r - r.mean()) / (r.max() - r.min() + EPS)
    if normalizer == "robust":
        median = r.median()
        mad = (r - median).abs().median()
        return (r - median) / (1.4826 * mad + EPS)
    below = (r.unsqueeze(1) > r.unsqueeze(0)).sum(1).to(torch.float32)  # rewards strictly below each
    ties = (r.unsqueeze(1) == r.unsqueeze(0)).sum(1).to(torch.float32)
    rank = below + (ties - 1) / 2  # 0-based mid-rank
    return 2 * rank / (r.numel() - 1) - 1
