"""Token-level divergences between a student's and a teacher's next-token distributions (distill, sdpg).

``generalized_jsd`` is the generalised Jensen-Shannon divergence of GKD (arXiv 2306.13649, eq. 1) as TRL's
``GKDTrainer.generalized_jsd_loss`` defines it: ``beta = 0`` is the forward KL, KL(teacher || student);
``beta = 1`` the reverse KL, KL(student || teacher); in between, ``beta * KL(teacher || m) + (1 - beta) *
KL(student || m)`` with the mixture ``m = beta * teacher + (1 - beta) * student``. It returns one value per
position (summed over the vocabulary), so callers choose the reduction: a sum over the batch's completion
tokens divided by their count over the whole data-parallel batch is what makes every layout equal one process.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def generalized_jsd(student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float, temperature: float = 1.0) -> torch.Tensor:
    """``[..., V]`` logits -> ``[...]`` divergences, computed in float32 (the log-softmax of bf16 logits loses the tail)."""
    student = F.log_softmax(student_logits.float() / temperature, dim=-1)
    teacher = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    if beta == 0:
        return _kl(teacher, student)
    if beta == 1:
        return _kl(student, teacher)
    mixture = torch.logsumexp(torch.stack([student + math.log1p(-beta), teacher + math.log(beta)]), dim=0)
    return beta * _kl(teacher, mixture) + (1 - beta) * _kl(student, mixture)


def _kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last dimension, from log-probabilities (``F.kl_div``'s argument order is (q, p))."""
    return F.kl_div(q_log, p_log, reduction="none", log_target=True).sum(-1)
