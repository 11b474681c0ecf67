"""Parallel setup: lay the model out once, and keep Accelerate from wrapping it again."""

from __future__ import annotations

from torch import nn

from halo_core.integrations.accelerate import PREPARED
from halo_core.parallel.config import ParallelConfig
from halo_core.parallel.layout_state import is_laid_out


def lay_out(model: nn.Module, config: ParallelConfig) -> nn.Module:
    """``parallelize`` unless already done (``halo_core.from_pretrained`` lays out while loading)."""
    from halo_core.parallel.parallelize import parallelize

    if not is_laid_out(model):
        model = parallelize(model, config)
    keep_from_accelerate(model)
    return model


def keep_from_accelerate(model: nn.Module) -> None:
    """The model owns its placement and gradient reduction: Accelerate must neither move it nor wrap it in DDP."""
    setattr(model, PREPARED, True)
