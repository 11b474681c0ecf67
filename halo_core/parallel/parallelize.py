"""``parallelize(model, config)``: the recipe that lays an unmodified transformers model out on the ranks.

Steps, in order: resolve and validate the degrees; find the family; check the model's
experts against ``ep`` and ``etp``, its heads against ``tp`` and ``cp``, its TP plan; build
the mesh; run the family's hooks (MoE blocks, attention, TP); switch the experts to the
``halo_ep`` implementation and attention to the ``halo_attention`` wrapper; FSDP2 over the
data-parallel ranks; record the layout. Every check that can fail runs before any weight moves.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from halo_core.adapt import apply_hooks
from halo_core.context import ParallelContext
from halo_core.errors import LayoutError
from halo_core.layout import find_moe_blocks
from halo_core.parallel import context_parallel, expert_parallel, expert_tensor_parallel, tensor_parallel
from halo_core.parallel.config import ParallelConfig
from halo_core.parallel.fsdp import apply_fsdp
from halo_core.parallel.layout_state import ModelLayout, attach, shard_of
from halo_core.parallel.mesh import build_mesh
from halo_core.parallel.plan import plan_layout, uses_grouped_mm
from halo_core.registry import Registry, discover


def _device_type(model: nn.Module, device_type: str | None) -> str:
    found = next(model.parameters()).device.type
    if found == "meta":
        if device_type is None:
            raise ValueError("the model's parameters are on the meta device: pass device_type ('cuda' or 'cpu') for the mesh")
        return device_type
    return found


def parallelize(model: nn.Module, config: ParallelConfig, registry: Registry | None = None, *, device_type: str | None = None) -> nn.Module:
    """Lay ``model`` out as ``config`` asks; call on every rank after ``torch.distributed`` is initialised.

    ``device_type`` names the mesh's device when the parameters are still on the meta device.
    """
    world = dist.get_world_size() if dist.is_initialized() else 1
    registry = registry or discover()
    plan = plan_layout(config, model.config, registry, world, experts_from_config=False)
    dims, record = plan.dims, plan.record
    if record is None:
        return _finish(model, config, dims, build_mesh(dims, _device_type(model, device_type)), [])
    wanted = plan.splits
    for name, block in find_moe_blocks(model, record.family):
        experts = getattr(block, record.family.experts)
        where = f"{name}.{record.family.experts}"
        plan.check_experts(name, expert_parallel.count_experts(experts))
        if dims.etp > 1:
            grouped = uses_grouped_mm(getattr(experts.config, "_experts_implementation", None))
            for param, width in expert_tensor_parallel.intermediate_widths(experts).items():
                plan.check_expert_width(f"{where}.{param}", width, getattr(experts, param).element_size(), grouped)
    if dims.tp > 1 and "shard_tp" not in registry.overridden_hooks(record):  # the core's TP needs a plan it can apply
        tensor_parallel.resolve_plan(model, record.family)

    mesh = build_mesh(dims, _device_type(model, device_type))
    dispatcher = plan.dispatcher_class(mesh.get_group("ep")) if plan.dispatcher_class else None
    context = ParallelContext(
        family=record.family, model_type=plan.model_type, model_config=model.config, dp=dims.dp, mesh=mesh, ep_dispatcher=dispatcher,
        cp_attention=config.cp_attention, **wanted
    )
    model = apply_hooks(model, registry, record, context)  # plan_layout checked the splits

    expert_modules = [(n, m) for n, m in model.named_modules() if expert_parallel.uses_expert_parallel(m)]
    interface = [m for _, m in expert_modules if expert_parallel.is_interface(m)]  # others run halo_ep through their forward
    if interface:
        model.set_experts_implementation(expert_parallel.IMPLEMENTATION)
        for experts in interface:  # an interface module a family put in a model transformers will not switch (Llama 4)
            experts.config._experts_implementation_internal = expert_parallel.IMPLEMENTATION
    if not expert_modules and dims.ep * dims.etp > 1:
        raise LayoutError(f"ep={dims.ep}, etp={dims.etp} asked, but family {record.name!r} distributed no experts in {type(model).__name__}")
    if any(context_parallel.uses_context_parallel(m) for m in model.modules()):
        model.set_attn_implementation(context_parallel.IMPLEMENTATION)
    elif dims.cp * dims.tp > 1:
        raise LayoutError(f"cp={dims.cp}, tp={dims.tp} asked, but family {record.name!r} wrapped no attention module in {type(model).__name__}")
    return _finish(model, config, dims, mesh, expert_modules, record.family)


def _finish(model: nn.Module, config: ParallelConfig, dims, mesh, expert_modules: list[tuple[str, nn.Module]], family=None) -> nn.Module:
    experts = {name: shard_of(module) for name, module in expert_modules}
    attention = {name: shard_of(module) for name, module in model.named_modules() if context_parallel.uses_context_parallel(module)}
    expert_params = frozenset(f"{name}.{p}" for name, shard in experts.items() for p in shard.rows)
    etp_whole = frozenset(f"{name}.{p}" for name, shard in experts.items() if shard.etp_size > 1 for p in shard.etp_whole)
    tp_partial = tensor_parallel.partial_gradient_parameters(model, family) if dims.tp > 1 else frozenset()
    use_fsdp = config.fsdp and mesh is not None
    outside = apply_fsdp(model, dims, mesh, [m for _, m in expert_modules], config.fsdp_unit_layers, expert_params) if use_fsdp else frozenset()
    attach(model, ModelLayout(dims, mesh, expert_params, fsdp=use_fsdp, etp_whole=etp_whole, tp_partial=tp_partial, experts=experts,
                              attention=attention, outside_fsdp=outside))
    return model
