"""The core's own hook implementations: the common case every family gets unless it says otherwise.

Registered last (``trylast``), so a family's implementation that returns non-``None`` wins.
Split engines arrive in later releases; until a split's engine exists its default
accepts only degree 1 and says so, rather than silently training a wrong layout.
"""

from __future__ import annotations

from halo_core.hookspecs import hookimpl


def _require_degree_one(context, splits: tuple[str, ...], where: str) -> None:
    for split in splits:
        if context.degree(split) > 1:
            raise NotImplementedError(
                f"{split}={context.degree(split)} asked for {where} of family {context.family.name!r}, "
                f"but this halo-core has no {split} engine yet; use {split}=1"
            )


@hookimpl(trylast=True)
def supported_splits(family, model_type):
    return family.splits


@hookimpl(trylast=True)
def wrap_moe_block(module, context):
    _require_degree_one(context, ("ep", "etp"), "a MoE block")
    return module


@hookimpl(trylast=True)
def wrap_attention(module, context):
    _require_degree_one(context, ("cp",), "an attention module")
    return module


@hookimpl(trylast=True)
def shard_tp(model, context):
    _require_degree_one(context, ("tp",), "the model")
    return model
