"""Optimizer choice (``bf16: true`` trains bf16 weights with ``AdamWBF16``; otherwise the user's ``optim`` stands)
and gradient clipping, which AdamWBF16 folds into its step."""

from __future__ import annotations

import torch

from halo_core.optim import AdamWBF16
from halo_core.parallel.grads import clip_grad_norm_, clip_scale


def wants_adamw_bf16(args) -> bool:
    return bool(args.bf16)


def build_adamw_bf16(trainer, kahan: bool) -> AdamWBF16:
    """AdamWBF16 with the trainer's learning rate, betas, epsilon and weight-decay grouping."""
    args = trainer.args
    decay = set(trainer.get_decay_parameter_names(trainer.model))
    params = [(n, p) for n, p in trainer.model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in params if n in decay], "weight_decay": args.weight_decay},
        {"params": [p for n, p in params if n not in decay], "weight_decay": 0.0},
    ]
    return AdamWBF16(
        [g for g in groups if g["params"]],
        lr=args.learning_rate,
        betas=(args.adam_beta1, args.adam_beta2),
        eps=args.adam_epsilon,
        kahan=kahan,
        seed=args.seed,
    )


def clip_gradients(model, optimizer, max_norm: float, owed: float = 1.0) -> torch.Tensor:
    """Global-norm clipping of gradients that still owe the factor ``owed`` (the data-parallel
    average's division, from ``sync_gradients(divide=False)``); return the norm before clipping.

    With AdamWBF16 the factor and the clipping go into its next step (its kernel reads each
    gradient once anyway) instead of passes that rescale every gradient in place; the
    ``.grad`` tensors then keep their summed, unclipped values.
    """
    inner = getattr(optimizer, "optimizer", optimizer)  # under Accelerate's AcceleratedOptimizer
    if not isinstance(inner, AdamWBF16):
        return clip_grad_norm_(model, max_norm, owed=owed)
    total, scale = clip_scale(model, max_norm, owed)
    inner.scale_next_gradients(scale)
    return total
