"""Runs a family's layout hooks over a model in the contract's calling order (see ``hookspecs``)."""

from __future__ import annotations

from torch import nn

from halo_core.context import ParallelContext
from halo_core.errors import LayoutError
from halo_core.layout import find_attention, find_moe_blocks
from halo_core.parallel.config import OWN_NAMES
from halo_core.registry import PluginRecord, Registry


def check_splits(registry: Registry, record: PluginRecord, context: ParallelContext, names=OWN_NAMES) -> None:
    """Refuse a layout the family does not declare, before any module is touched; ``names``: what the message calls
    the degrees it asks to reset (``RUN_KEYS``: a run's YAML keys)."""
    supported = registry.supported_splits(record, context.model_type)
    missing = context.active_splits - supported
    if missing:
        asked = ", ".join(f"{names[s]}={context.degree(s)}" for s in sorted(missing))
        raise LayoutError(
            f"family {record.name!r} ({record.distribution}) does not support {asked} for model type "
            f"{context.model_type!r}; it supports {sorted(supported) or 'data parallelism only'}. "
            f"Set {', '.join(f'{names[s]}=1' for s in sorted(missing))}.", tuple(sorted(missing))
        )


def adapt_model(model: nn.Module, registry: Registry, record: PluginRecord, context: ParallelContext) -> nn.Module:
    """Wrap MoE blocks, then attention modules, then apply TP; returns the adapted model."""
    check_splits(registry, record, context)
    return apply_hooks(model, registry, record, context)


def apply_hooks(model: nn.Module, registry: Registry, record: PluginRecord, context: ParallelContext) -> nn.Module:
    """``adapt_model`` for a caller whose ``plan_layout`` has checked the family's splits already (``parallelize``)."""
    hooks = registry.hooks(record)
    blocks = find_moe_blocks(model, record.family)
    if not blocks and context.ep * context.etp > 1:
        raise LayoutError(
            f"family {record.name!r} declares MoE blocks at {record.family.moe_block} with children "
            f"{record.family.router!r} and {record.family.experts!r}, but {type(model).__name__} has none there"
        )
    for name, block in blocks:
        _replace(model, name, block, hooks.wrap_moe_block(module=block, context=context))
    for name, attention in find_attention(model, record.family):
        _replace(model, name, attention, hooks.wrap_attention(module=attention, context=context))
    return hooks.shard_tp(model=model, context=context)


def _replace(model: nn.Module, name: str, old: nn.Module, new: nn.Module) -> None:
    if new is not old:
        model.set_submodule(name, new)
