"""Adapters on a laid-out model: stock PEFT on dense modules, the grouped LoRA on fused experts, the base frozen.

Added after ``parallelize``, so a model read straight into its layout (``from_pretrained``) and one built from
its config get them the same way. Stock PEFT wraps the dense ``nn.Linear`` targets in place (their base
weights stay in their FSDP2 units); the adapters themselves are small and kept outside FSDP2 (whole, or
split with a TP-split base: ``split_dense_over_tp``), their gradients summed like the non-FSDP path's (``grads``). Initial
values are PEFT's: the same generator, reset to the run's seed, drawn in PEFT's order (dense targets,
then fused parameters in module order), every rank drawing every expert's adapter and keeping its own,
so any layout starts from the one-process adapter.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from dataclasses import dataclass

import torch
from torch import nn

from halo_core.errors import HaloError
from halo_core.integrations.transformers import is_experts
from halo_core.lora import grouped
from halo_core.parallel.expert_tensor_parallel import take_slice
from halo_core.parallel.layout_state import attach, layout_of, register_shard, shard_of


class LoraError(HaloError):
    """LoRA targets or settings that cannot apply to this model or layout; the message names the key."""


@dataclass(frozen=True)
class Adapters:
    """What ``add_adapters`` put on a model (kept in its layout): the config, and the names of what trains."""

    config: object  # peft.LoraConfig
    #: Experts module name -> the fused weights it adapts, in the module's order (PEFT nests them so).
    experts: dict
    #: Names (``named_parameters``) of stock PEFT's dense adapter weights.
    dense: frozenset
    #: What ``adapter_config.json`` names as the base (a folder or a hub id).
    base_model: str | None = None


@dataclass(frozen=True)
class Targets:
    dense: object  # a LoraConfig for stock PEFT (target_modules only), or None
    experts: dict  # experts module name -> fused weight names
    modules_to_save: tuple
    #: Every targeted parameter (fused or not), in the order PEFT adapts them (which fixes the initial values).
    parameters: tuple = ()




def experts_outside_interface(model: nn.Module) -> frozenset[str]:
    """Names of the expert weights of MoE blocks whose experts are not at transformers' interface (DBRX's stacked
    ``mlp.w1``, JetMoE's ``input_linear.weight``): expert parallelism splits them, and only stock PEFT could adapt
    them, whole. Everything in such a block but its router."""
    from halo_core.layout import find_moe_blocks
    from halo_core.registry import discover

    record = discover(strict=False).family_record(model.config.model_type)
    if record is None or not record.ok:
        return frozenset()
    family = record.family
    names = set()
    for block_name, block in find_moe_blocks(model, family):
        if is_experts(getattr(block, family.experts)):
            continue
        router = {id(p) for p in getattr(block, family.router).parameters()}
        names |= {f"{block_name}.{n}" for n, p in block.named_parameters() if id(p) not in router}
    return frozenset(names)


def refuse_split_experts(keys, outside: frozenset[str]) -> None:
    """LoRA on expert weights outside the interface, under expert parallelism: each rank would hold stock PEFT's
    adapter of its own slice of the experts, which no one-process run has."""
    hit = [key for key in keys if key in outside]
    if hit:
        raise LoraError(f"lora_target_parameters: {hit[0]} is an expert weight outside transformers' experts interface; expert "
                        f"parallelism splits it and Halo's grouped LoRA cannot adapt it: drop it from the targets, or train "
                        f"at expert_parallel_size: 1 (stock PEFT adapts it whole)")


def plan_targets(model: nn.Module, config) -> Targets:
    """Split ``config``'s targets into stock PEFT's and the grouped LoRA's (fused expert weights).

    ``config`` is first converted as PEFT converts it for transformers 5's fused MoE layouts (``all-linear``
    and v4 projection names such as ``gate_proj`` become fused ``target_parameters`` plus the router's
    weight, with ``rank_pattern`` for fused pairs); the caller keeps the converted config, as PEFT does."""
    from halo_core.integrations.peft import convert_peft_config_for_transformers, get_model_conversion_mapping

    if getattr(config, "use_dora", False):
        raise LoraError("use_dora: DoRA is not supported on Halo's layouts; set use_dora: false")
    modules = config.target_modules
    listed = [modules] if isinstance(modules, str) else list(modules or [])
    if "lm_head" in listed:
        raise LoraError("lora_target_modules: 'lm_head' cannot take an adapter (the loss reads lm_head.weight directly, as in TRL); remove it")
    expert_modules = {name: m for name, m in model.named_modules() if is_experts(m)}
    fused = {f"{name}.{p}" for name, m in expert_modules.items() for p, t in m.named_parameters(recurse=False) if t.dim() == 3}
    for target in listed:
        if target != "all-linear" and any(key == target or key.endswith("." + target) for key in fused):
            raise LoraError(
                f"lora_target_modules: {target!r} is a fused expert parameter, not a module; list it under "
                f"lora_target_parameters (e.g. mlp.experts.gate_up_proj) instead")
    try:
        convert_peft_config_for_transformers(config, model=model, conversions=get_model_conversion_mapping(model))
    except ValueError as exc:
        raise LoraError(f"lora_target_modules={modules!r}: {' '.join(str(exc).split())}") from None
    wanted = sorted(config.target_parameters or [])
    order = []  # PEFT's order: modules as named_modules yields them, each one's parameters as registered
    for module_name, module in model.named_modules():
        for param_name, _ in module.named_parameters(recurse=False):
            key = f"{module_name}.{param_name}"
            if any(key == t or key.endswith("." + t) for t in wanted):
                order.append(key)
    for target in wanted:
        if not any(key == target or key.endswith("." + target) for key in order):
            raise LoraError(f"lora_target_parameters: {target!r} matches no parameter of {type(model).__name__} "
                            f"(its fused expert weights: {sorted({'.'.join(k.rsplit('.', 3)[-3:]) for k in fused}) or 'none'})")
    experts: dict[str, list[str]] = {}
    for key in order:
        if key in fused:
            experts.setdefault(key.rsplit(".", 1)[0], []).append(key.rsplit(".", 1)[1])
    from halo_core.integrations.peft import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    dense = None
    remaining = config.target_modules
    # No lora_target_modules: PEFT's default modules for the model type (beside any fused targets, as PEFT does).
    if remaining or (modules is None and (model.config.model_type in DEFAULTS or not order)):
        dense = dataclasses.replace(config, target_parameters=None, modules_to_save=None)
    return Targets(dense, experts, tuple(config.modules_to_save or ()), tuple(order))


def _inject(config, model: nn.Module, names: list[str]) -> None:
    """One call of stock PEFT's ``inject_adapter_in_model`` among the several a model may take (dense modules, each
    plain targeted parameter), each as if it were the model's first.

    PEFT checks each call's ``rank_pattern``/``alpha_pattern`` keys against what that call adapts and warns of the
    rest as "ignored": keys for the fused experts (PEFT's conversion adds ``.*\\.gate_up_proj``) are read by Halo's
    grouped LoRA (``_rank_and_alpha``), not ignored, so each call gets only the keys matching one of ``names`` (what
    it may adapt). A model already holding ``peft_config`` (an earlier call's) makes PEFT warn of "multiple adapters";
    there is one adapter, so the earlier record is set aside for the call."""
    from peft import inject_adapter_in_model

    def kept(pattern: dict) -> dict:
        return {k: v for k, v in pattern.items() if any(re.match(rf"(.*\.)?({k})$", name) for name in names)}

    config = dataclasses.replace(config, rank_pattern=kept(config.rank_pattern or {}), alpha_pattern=kept(config.alpha_pattern or {}))
    model.__dict__.pop("peft_config", None)
    inject_adapter_in_model(config, model)


def inject_dense(model: nn.Module, dense_config) -> None:
    names = [name for name, _ in model.named_modules() if name]
    try:
        _inject(dense_config, model, names)
    except ValueError as exc:  # PEFT: targets not found, or a module it cannot adapt
        targets = dense_config.target_modules
        shown = targets if isinstance(targets, str) or targets is None else sorted(targets)
        raise LoraError(f"lora_target_modules={shown!r}: {' '.join(str(exc).split())}") from None


def split_dense_over_tp(model: nn.Module, layout, init) -> None:
    """Stock PEFT's dense adapters on TP-split linear layers, redrawn whole and split as their base is.

    PEFT reads a DTensor on a ``tp`` dimension as a local shard and builds local-size adapters, drawing (and so
    initialising every later adapter) differently from one process. Here each adapter is drawn again at its
    whole shape, in PEFT's order and way (its two ``nn.Linear``, then ``reset_lora_parameters``), and then split:
    a column-wise base (output split) gets ``lora_B`` column-wise (its input, A's rank-r output, replicated); a
    row-wise base (input split) gets ``lora_A`` row-wise (its partial rank-r outputs summed over the TP group, as
    the base's are), ``lora_B`` whole. Gradients then need no more than the data-parallel sum (``grads``).
    """
    from peft.tuners.lora.layer import Linear as LoraLinear
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp_mesh = layout.mesh["tp"]
    for name, module in model.named_modules():
        if not isinstance(module, LoraLinear):
            continue
        base = module.get_base_layer()
        for adapter in list(module.lora_A):
            r = module.r[adapter]
            a = nn.Linear(base.in_features, r, bias=False)
            b = nn.Linear(r, base.out_features, bias=module.lora_B[adapter].bias is not None)
            if init is True:
                nn.init.kaiming_uniform_(a.weight, a=5 ** 0.5)
            elif isinstance(init, str) and init.lower() == "gaussian":
                nn.init.normal_(a.weight, std=1 / r)
            else:
                raise LoraError(f"init_lora_weights={init!r} is not supported with tensor_parallel_size > 1 (True or 'gaussian')")
            nn.init.zeros_(b.weight)
            if b.bias is not None:
                nn.init.zeros_(b.bias)
            weight = base.weight
            a.to(device=weight.device, dtype=weight.dtype)
            b.to(device=weight.device, dtype=weight.dtype)
            style = None
            if isinstance(weight, DTensor) and "tp" in (weight.device_mesh.mesh_dim_names or ()):
                placement = weight.placements[weight.device_mesh.mesh_dim_names.index("tp")]
                style = getattr(placement, "dim", None)
            if style == 0:
                parallelize_module(b, tp_mesh, ColwiseParallel())
            elif style == 1:
                parallelize_module(a, tp_mesh, RowwiseParallel())
            module.lora_A[adapter], module.lora_B[adapter] = a, b


def inject_parameter(model: nn.Module, config, key: str) -> None:
    """A plain targeted parameter (the router's weight) through stock PEFT's ``ParamWrapper``; without dropout,
    which it cannot apply (its delta is added to the weight): stock PEFT refuses the run instead (TRL's
    default ``lora_dropout`` is 0.05), Halo keeps dropout on every other adapter."""
    try:
        _inject(dataclasses.replace(config, target_modules=[], target_parameters=[key], modules_to_save=None, lora_dropout=0.0),
                model, [key.rsplit(".", 1)[0], key])
    except ValueError as exc:
        raise LoraError(f"lora_target_parameters: {key}: {' '.join(str(exc).split())}") from None


def _ensure_shard(experts: nn.Module):
    """The experts' ``ExpertShard``; outside EP a one-rank shard, so the grouped LoRA runs in ``halo_ep``'s grouped GEMM."""
    from halo_core.parallel.expert_parallel import ExpertShard, LocalDispatch, _inner_implementation, count_experts

    shard = shard_of(experts)
    if shard is None:
        total = count_experts(experts)
        shard = ExpertShard(0, total, total, 1, LocalDispatch(), _inner_implementation(experts))
        register_shard(experts, shard)
    return shard


def add_adapters(model: nn.Module, config, seed: int, base_model: str | None = None) -> Adapters:
    """Freeze the laid-out ``model`` and add ``config``'s adapters (PEFT's initial values, from ``seed``);
    ``base_model``: what the saved adapter names as its base."""
    from halo_core.parallel import grouped_experts
    from halo_core.parallel.expert_parallel import IMPLEMENTATION

    layout = layout_of(model)
    config = for_model(config, model)
    targets = plan_targets(model, config)
    model.requires_grad_(False)
    torch.manual_seed(seed)
    if targets.dense is not None:
        inject_dense(model, targets.dense)
        if layout.dims.tp > 1:
            torch.manual_seed(seed)
            split_dense_over_tp(model, layout, config.init_lora_weights)
    expert_names, whole_grad, shards = set(), set(), {}
    if layout.dims.ep > 1:
        refuse_split_experts(targets.parameters, experts_outside_interface(model))
    for key in targets.parameters:
        module_name, weight = key.rsplit(".", 1)
        if module_name not in targets.experts:
            inject_parameter(model, config, key)
            continue
        experts = model.get_submodule(module_name)
        shard = shards.get(module_name) or _ensure_shard(experts)
        if not grouped_experts.handles(experts, shard.inner):
            raise LoraError(f"LoRA on {module_name}'s fused experts runs in the grouped GEMM; set experts_implementation: grouped_mm "
                            f"(it is {experts.config._experts_implementation!r})")
        shards[module_name] = shard
        r, alpha = _rank_and_alpha(config, key)
        out_features, in_features = grouped.global_dims(experts, weight, shard)
        a, b = grouped.peft_initial(shard.num_experts, r, in_features, out_features, config.init_lora_weights)
        splits, whole = grouped.adapter_splits(experts, weight, shard)
        dtype, device = getattr(experts, weight).dtype, getattr(experts, weight).device
        for name, value in zip(grouped.names(weight), (a, b)):
            value = value[shard.first : shard.first + shard.count]
            if name in splits:
                value = take_slice(value, splits[name], shard.etp_rank, shard.etp_size)
            experts.register_parameter(name, nn.Parameter(value.to(device=device, dtype=dtype).contiguous()))
            expert_names.add(f"{module_name}.{name}")
        shard.etp_splits.update(splits)
        if whole:
            whole_grad.add(f"{module_name}.{whole}")
        scaling = alpha / (r ** 0.5 if config.use_rslora else r)
        shard.lora[weight] = grouped.ExpertLora(scaling, config.lora_dropout)
    dense = frozenset(n for n, p in model.named_parameters() if p.requires_grad) - expert_names
    if shards:
        for name, module in model.named_modules():  # halo_ep runs every experts module: each needs its shard
            if is_experts(module):
                shards.setdefault(name, _ensure_shard(module))
        model.set_experts_implementation(IMPLEMENTATION)
    if "peft_config" in model.__dict__:
        model.peft_config = {"default": config}  # the run's one adapter, as PEFT records it (not the last call's part of it)
    _train_whole(model, targets.modules_to_save)
    adapters = Adapters(config, dict(targets.experts), dense, base_model)
    attach(model, dataclasses.replace(
        layout, expert_params=layout.expert_params | expert_names, etp_whole=layout.etp_whole | whole_grad,
        outside_fsdp=layout.outside_fsdp | dense | expert_names, experts={**layout.experts, **shards}, adapters=adapters))
    return adapters


def _rank_and_alpha(config, key: str) -> tuple[int, float]:
    """``r`` and ``lora_alpha`` for one target as PEFT reads them (``rank_pattern`` / ``alpha_pattern`` first)."""
    from halo_core.integrations.peft import get_pattern_key

    r = config.rank_pattern.get(get_pattern_key(config.rank_pattern.keys(), key), config.r)
    alpha = config.alpha_pattern.get(get_pattern_key(config.alpha_pattern.keys(), key), config.lora_alpha)
    return r, alpha


def for_model(config, model: nn.Module):
    """A copy of ``config`` as PEFT reads it for this model: a sequence-classification model (a ``score`` head) is
    PEFT's ``SEQ_CLS`` task, whose head trains whole (``modules_to_save``) and takes no adapter."""
    config = copy.deepcopy(config)
    if isinstance(getattr(model, "score", None), nn.Linear):
        config.task_type = "SEQ_CLS"
        config.modules_to_save = sorted({*(config.modules_to_save or ()), "score"})
    return config


def _train_whole(model: nn.Module, modules: tuple) -> None:
    """``lora_modules_to_save`` trained in place (whole, as PEFT trains its copy of them)."""
    wanted = set(modules)
    for target in sorted(wanted):
        hits = [n for n, _ in model.named_modules() if n == target or n.endswith("." + target)]
        if not hits:
            raise LoraError(f"lora_modules_to_save: {target!r} matches no module of {type(model).__name__}")
        for hit in hits:
            for param in model.get_submodule(hit).parameters():
                param.requires_grad_(True)
