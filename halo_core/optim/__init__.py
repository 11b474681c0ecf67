"""Optimizers Halo adds: ``AdamWBF16`` (bf16 parameters and moments, fp32 math, stochastic rounding)."""

from halo_core.optim.adamw_bf16 import AdamWBF16

__all__ = ["AdamWBF16"]
