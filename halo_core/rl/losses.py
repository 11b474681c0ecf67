"""GRPO's policy loss over per-token log-probs, normalised so that data-parallel ranks add up to one process.

The per-token term is TRL's (``GRPOTrainer._compute_loss``): ``-min(ρ A, clip(ρ, 1-ε_low, 1+ε_high) A)`` with
``ρ = exp(logp - old_logp)`` (1 with no old pass: one update per batch). The reductions differ from TRL's in one respect: TRL's ``bnpo`` divides by the
rank's own token count, so two ranks with different completion lengths do not average to one process; here
``tokens`` (the token count of the whole data-parallel batch, summed over ranks) is the divisor, and each rank's
loss is its share, so the ranks' losses add up to the one-process loss (``grpo``'s per-sequence means and
``dr_grpo``'s fixed divisor need only the global number of sequences).
"""

from __future__ import annotations

import torch

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo")


def per_token_loss(logps: torch.Tensor, advantages: torch.Tensor, old_logps: torch.Tensor | None = None, epsilon_low: float = 0.2,
                   epsilon_high: float = 0.2) -> torch.Tensor:
    """``(B, T)`` per-token losses; ``advantages`` ``(B,)`` or ``(B, 1)``."""
    advantages = advantages.reshape(-1, 1).to(logps.dtype)
    old = logps.detach() if old_logps is None else old_logps
    ratio = torch.exp(logps - old)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    return -torch.min(ratio * advantages, clipped * advantages)


def reduce_loss(loss: torch.Tensor, mask: torch.Tensor, loss_type: str, *, sequences: int, tokens: int | torch.Tensor,
                max_completion_length: int | None = None) -> torch.Tensor:
    """This rank's share of the batch loss: the ranks' shares add up to the loss one process computes on the whole
    batch. ``sequences`` / ``tokens``: the whole data-parallel batch's completions and completion tokens."""
    mask = mask.to(loss.dtype)
    if loss_type == "grpo":
        return ((loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / sequences
    if loss_type == "bnpo":
        return (loss * mask).sum() / torch.as_tensor(tokens, dtype=loss.dtype, device=loss.device).clamp(min=1.0)
    if loss_type == "dr_grpo":
        if not max_completion_length:
            raise ValueError("loss_type 'dr_grpo' needs max_completion_length (its fixed divisor)")
        return (loss * mask).sum() / (sequences * max_completion_length)
    raise ValueError(f"loss_type={loss_type!r}; offline GRPO takes one of {list(LOSS_TYPES)}")
