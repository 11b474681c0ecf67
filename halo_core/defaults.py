"""The core's own hook implementations: the common case every family gets unless it says otherwise.

Registered last (``trylast``), so a family's implementation that returns non-``None`` wins.
"""

from __future__ import annotations

from halo_core.hookspecs import hookimpl


@hookimpl(trylast=True)
def supported_splits(family, model_type):
    return family.splits


@hookimpl(trylast=True)
def wrap_moe_block(module, context):
    """Common case: distribute the experts child at transformers' experts interface; the router stays as is."""
    if context.ep > 1 or context.etp > 1:
        from halo_core.parallel.expert_parallel import shard_experts

        experts = getattr(module, context.family.experts)
        etp_group = context.mesh.get_group("etp") if context.etp > 1 else None
        shard_experts(
            experts, context.local_rank("ep"), context.ep, context.ep_dispatcher,
            etp_rank=context.local_rank("etp"), etp_size=context.etp, etp_group=etp_group,
        )
    return module


@hookimpl(trylast=True)
def wrap_attention(module, context):
    """Common case: context parallelism through the attention registry (Ulysses or ring); the module is kept.

    Under TP alone the same wrapper only hands the inner implementation this rank's heads.
    """
    if context.cp > 1 or context.tp > 1:
        from halo_core.parallel.context_parallel import shard_attention

        config = getattr(module, "config", context.model_config)
        group = context.mesh.get_group("cp") if context.cp > 1 else None
        shard_attention(module, config._attn_implementation, group, context.cp, context.local_rank("cp"), context.cp_attention)
    return module


@hookimpl(trylast=True)
def shard_tp(model, context):
    """Common case: DTensor column/row-wise linear layers from the family's or the config's TP plan."""
    if context.tp > 1:
        from halo_core.parallel.tensor_parallel import apply_tensor_parallel

        apply_tensor_parallel(model, context.family, context.mesh["tp"])
    return model
