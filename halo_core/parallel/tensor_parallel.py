"""Tensor parallelism with PyTorch's DTensor ``parallelize_module`` over the mesh's ``tp`` dimension.

The plan says which ``nn.Linear`` modules are split column-wise (outputs: q/k/v, gate/up)
and which row-wise (inputs: o, down, whose partial sums DTensor all-reduces). It is the
family's ``Family.tp_plan`` where it declares one, else the model's own
``base_model_tp_plan`` (transformers' names relative to the base model), keeping the
``colwise``/``rowwise`` entries for linear layers; experts are left to EP/ETP and the
router, embeddings, norms and ``lm_head`` stay replicated, so every TP rank computes
the same residual stream. Per-head parameters of attention modules (GPT-OSS's sinks)
are split with the heads; the attention wrapper hands the inner implementation the
local part (``local_heads.LocalHeads``).
"""

from __future__ import annotations

from typing import Mapping

from torch import nn
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from halo_core.hf_config import text_config
from halo_core.errors import LayoutError
from halo_core.layout import find_attention, matches

STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
#: transformers' name for a module kept whole whose input is this rank's heads only (Qwen3's
#: q/k norms): each TP rank's gradient is a part, summed over the TP group.
PARTIAL_GRADIENT = "replicated_with_grad_allreduce"


def declared_plan(model: nn.Module, family) -> dict[str, str]:
    """Patterns over full module names -> ``colwise``/``rowwise``."""
    if family.tp_plan:
        return dict(family.tp_plan)
    plan = getattr(text_config(model.config), "base_model_tp_plan", None) or {}
    prefix = getattr(model, "base_model_prefix", "")
    if prefix and hasattr(model, prefix):
        plan = {f"{prefix}.{key}": style for key, style in plan.items()}
    return plan


def resolve_plan(model: nn.Module, family) -> dict[str, str]:
    """The plan as concrete module names; refuses a family that declares ``tp`` but has nothing to split."""
    patterns = declared_plan(model, family)
    known = sorted(STYLES) + [PARTIAL_GRADIENT]
    for pattern, style in patterns.items():
        if family.tp_plan and style not in known:
            raise LayoutError(f"Family.tp_plan[{pattern!r}] = {style!r}; use one of {known}")
    for name, module in model.named_modules():
        for pattern, style in patterns.items():
            if style not in known and isinstance(module, nn.Linear) and matches(name, (pattern,)):
                raise LayoutError(
                    f"the model's base_model_tp_plan splits {name} as {style!r}, which Halo's tensor parallelism does "
                    f"not implement; set tensor_parallel_size=1 for {model.config.model_type!r}, or declare a Family.tp_plan "
                    f"with {known} only"
                )
    plan = {
        name: style
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
        for pattern, style in patterns.items()
        if style in STYLES and matches(name, (pattern,))
    }
    if not any(style == "rowwise" for style in plan.values()):
        raise LayoutError(
            f"family {family.name!r} declares tp, but neither Family.tp_plan nor the config's base_model_tp_plan "
            f"names linear layers of {type(model).__name__} to split; declare Family.tp_plan "
            f"(e.g. {{'model.layers.*.self_attn.q_proj': 'colwise', ..., 'model.layers.*.self_attn.o_proj': 'rowwise'}})"
        )
    return plan


def partial_gradient_parameters(model: nn.Module, family) -> frozenset[str]:
    """Names of parameters kept whole whose gradients the TP ranks each hold a part of."""
    patterns = tuple(p for p, style in declared_plan(model, family).items() if style == PARTIAL_GRADIENT)
    return frozenset(
        f"{name}.{param}" for name, module in model.named_modules() if patterns and matches(name, patterns)
        for param, _ in module.named_parameters(recurse=False)
    )


def per_head_parameters(module: nn.Module, num_heads: int) -> list[str]:
    return [n for n, p in module.named_parameters(recurse=False) if p.dim() == 1 and p.shape[0] == num_heads]


def apply_tensor_parallel(model: nn.Module, family, tp_mesh, plan: Mapping[str, str] | None = None) -> nn.Module:
    """Split the plan's linear layers and the attention modules' per-head parameters over ``tp_mesh``."""
    plan = resolve_plan(model, family) if plan is None else plan
    parallelize_module(model, tp_mesh, {name: STYLES[style]() for name, style in plan.items()})
    heads = text_config(model.config).num_attention_heads
    size, rank = tp_mesh.size(), tp_mesh.get_local_rank()
    for _, attention in find_attention(model, family):
        for name in per_head_parameters(attention, heads):
            full = getattr(attention, name)
            local = full.detach().chunk(size)[rank].clone()
            sharded = DTensor.from_local(local, tp_mesh, [Shard(0)], run_check=False)
            attention.register_parameter(name, nn.Parameter(sharded, requires_grad=full.requires_grad))
    return model


def check_head_split(config, tp: int, cp: int, cp_attention: str) -> None:
    """The one rule for heads: TP splits them, Ulysses CP scatters each TP rank's over ``cp``, ring keeps them."""
    from halo_core.parallel import context_parallel

    heads_cp = cp if cp_attention == "ulysses" else 1
    if tp > 1:
        check_heads(config, tp, heads_cp)
    elif heads_cp > 1:
        context_parallel.check_heads(config, heads_cp)


def check_heads(config, tp: int, cp: int) -> None:
    """TP splits heads, and Ulysses CP then scatters each TP rank's heads: both head counts must divide by ``tp * cp``."""
    text = text_config(config)
    for field in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(text, field, None)
        if heads and heads % (tp * cp):
            what = f"tensor_parallel_size tp={tp}" + (f" times context_parallel_size cp={cp}" if cp > 1 else "")
            raise LayoutError(f"{field}={heads} is not divisible by {what}; both split attention heads, so choose degrees whose product divides both head counts")
