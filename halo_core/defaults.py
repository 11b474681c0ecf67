"""The core's own hook implementations: the common case every family gets unless it says otherwise.

Registered last (``trylast``), so a family's implementation that returns non-``None`` wins.
Until a split's engine exists (TP and ETP today) its default accepts only degree 1 and
says so, rather than silently training a wrong layout.
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
    """Common case: distribute the experts child at transformers' experts interface; the router stays as is."""
    _require_degree_one(context, ("etp",), "a MoE block")
    if context.ep > 1:
        from halo_core.parallel.expert_parallel import shard_experts

        experts = getattr(module, context.family.experts)
        shard_experts(experts, context.local_rank("ep"), context.ep, context.ep_dispatcher)
    return module


@hookimpl(trylast=True)
def wrap_attention(module, context):
    """Common case: context parallelism through the attention registry (Ulysses); the module is kept."""
    if context.cp > 1:
        from halo_core.parallel.context_parallel import shard_attention

        config = getattr(module, "config", context.model_config)
        shard_attention(module, config._attn_implementation, context.mesh.get_group("cp"), context.cp, context.local_rank("cp"))
    return module


@hookimpl(trylast=True)
def shard_tp(model, context):
    _require_degree_one(context, ("tp",), "the model")
    return model
