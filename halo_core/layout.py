"""Where a family's modules sit in a model: matching declarations, and reading them off a model.

Patterns are module names with ``*`` standing for exactly one path segment, so
``model.layers.*.mlp`` matches ``model.layers.3.mlp`` and nothing deeper.
"""

from __future__ import annotations

import inspect
import re
from functools import lru_cache

from torch import nn

from halo_core.family import Family


@lru_cache(maxsize=None)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile("^" + r"[^.]+".join(re.escape(part) for part in pattern.split("*")) + "$")


def matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(_regex(p).match(name) for p in patterns)


def find_moe_blocks(model: nn.Module, family: Family) -> list[tuple[str, nn.Module]]:
    """MoE blocks as the family declares them: a pattern match that has both router and experts children.

    The child check keeps dense MLPs that share a MoE block's path (Qwen3-MoE's
    ``mlp_only_layers``, say) out of the result.
    """
    return [
        (name, module)
        for name, module in model.named_modules()
        if matches(name, family.moe_block)
        and isinstance(getattr(module, family.experts, None), nn.Module)
        and isinstance(getattr(module, family.router, None), nn.Module)
    ]


def find_attention(model: nn.Module, family: Family) -> list[tuple[str, nn.Module]]:
    return [(name, module) for name, module in model.named_modules() if matches(name, family.attention)]


def _fused_expert_count(module: nn.Module) -> int | None:
    """Number of experts if ``module`` holds fused 3-D expert weights (transformers' experts interface).

    At least two 3-D parameters with the same leading size (gate/up and down projections),
    so a lone convolution weight is not taken for experts.
    """
    leading = [p.shape[0] for p in module.parameters(recurse=False) if p.dim() == 3]
    return leading[0] if len(leading) >= 2 and len(set(leading)) == 1 else None


#: The forward arguments of transformers' experts interface, after ``self``.
INTERFACE_ARGUMENTS = ("hidden_states", "top_k_index", "top_k_weights")


def has_interface_signature(module: nn.Module) -> bool:
    """Whether ``module``'s forward takes exactly the experts interface's arguments (decorated or not)."""
    try:
        return tuple(inspect.signature(type(module).forward).parameters)[1:] == INTERFACE_ARGUMENTS
    except (TypeError, ValueError):
        return False


def takes_expert_major_rows(module: nn.Module) -> bool:
    """Whether ``module`` holds fused 3-D expert weights and its forward takes the hidden states alone: transformers'
    convention for experts that run every token, the rows "sorted per expert already" (``[E * tokens, hidden]``,
    expert-major: Llama 4's ``Llama4TextExperts``). The kit holds a family that relies on it to one process."""
    try:
        arguments = tuple(inspect.signature(type(module).forward).parameters)[1:]
    except (TypeError, ValueError):
        return False
    return arguments == ("hidden_states",) and _fused_expert_count(module) is not None


def stacked_expert_count(module: nn.Module) -> int | None:
    """Number of experts of a module called as the experts interface is, but without its fused 3-D weights: its
    ``num_experts`` equal blocks stacked along dim 0 of every weight (DBRX's ``mlp.w1``, ``[E * I, H]``)."""
    count = getattr(module, "num_experts", None)
    weights = [p for p in module.parameters() if p.dim() >= 2]
    if not isinstance(count, int) or count < 2 or not weights or not has_interface_signature(module):
        return None
    return count if all(p.shape[0] % count == 0 for p in weights) else None


def expert_count(module: nn.Module) -> int | None:
    """Number of experts if ``module`` holds them in a layout the core distributes (fused or stacked), else ``None``."""
    return _fused_expert_count(module) or stacked_expert_count(module)


def router_weight(router: nn.Module, num_experts: int, extra_classes: bool = False) -> nn.Parameter | None:
    """The router's ``[num_experts, hidden]`` projection: its own ``weight`` or that of a child (``router.proj``).
    ``extra_classes``: failing that, one with more rows, for a router that also scores classes with no weights
    (LongCat-Flash's zero experts, which pass their input through)."""
    weights = [getattr(m, "weight", None) for m in router.modules()]
    weights = [w for w in weights if isinstance(w, nn.Parameter) and w.dim() == 2]
    exact = [w for w in weights if w.shape[0] == num_experts]
    more = [w for w in weights if w.shape[0] > num_experts] if extra_classes else []
    return (exact or more or [None])[0]


#: A MoE block's child that routes, by its name or its class's name, where its weight has more rows than there are experts.
_ROUTER_NAME = re.compile(r"(router|gate|gating)$", re.IGNORECASE)


def _router_child(block: nn.Module, experts: nn.Module, count: int) -> str | None:
    siblings = [(name, child) for name, child in block.named_children() if child is not experts]
    exact = [name for name, child in siblings if router_weight(child, count) is not None]
    named = [name for name, child in siblings if _ROUTER_NAME.search(name) or _ROUTER_NAME.search(type(child).__name__)]
    wider = [name for name in named if router_weight(dict(siblings)[name], count, extra_classes=True) is not None]
    return (exact or wider or named or [None])[0]


def name_pattern(name: str) -> str:
    return ".".join("*" if part.isdigit() else part for part in name.split("."))


def _unique(items: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def infer_layout(model: nn.Module) -> dict[str, tuple[str, ...] | str]:
    """Read a family declaration's layout fields off an instantiated model.

    A MoE block is a module with a child holding fused 3-D expert weights (or, called as the
    experts interface is, weights that stack its experts along dim 0); its router
    is the sibling whose weight has one row per expert, else one named or classed as a
    router or gate (its weight wider, its scores from an MLP). Attention modules are those
    whose class name ends in ``Attention``. Used by ``halo new-family`` to fill in a
    scaffold; a human confirms the result.
    """
    blocks, routers, experts, attention = [], [], [], []
    for name, module in model.named_modules():
        if type(module).__name__.endswith("Attention"):
            attention.append(name_pattern(name))
        for child_name, child in module.named_children():
            count = expert_count(child)
            router_name = _router_child(module, child, count) if count is not None else None
            if router_name is not None:
                blocks.append(name_pattern(name))
                routers.append(router_name)
                experts.append(child_name)
    layout: dict[str, tuple[str, ...] | str] = {"moe_block": _unique(blocks), "attention": _unique(attention)}
    if routers:
        layout["router"] = routers[0]
        layout["experts"] = experts[0]
    return layout
