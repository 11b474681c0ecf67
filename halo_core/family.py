"""The declaration a family plugin returns from `halo_family()`.

A family says which transformers model types it claims and where its MoE blocks,
router, experts and attention live. Everything it leaves at the default is the
common case, handled by the core; it only writes hook implementations where the
family really differs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

#: The plugin contract as "MAJOR.MINOR"; a plugin declares the version it was written for. The major is bumped when the
#: contract changes incompatibly (plugins of another major are refused), the minor when it only grows: a plugin of the
#: same major and an older minor still loads, with a FutureWarning (its deprecation path), and one of a newer minor
#: is refused (it may rely on what this core lacks). A bare int N, as plugins wrote before minors existed, means "N.0".
PLUGIN_API_VERSION = "1.0"

#: Splits a family may declare. FSDP2 data parallelism is always available and is not declared.
SPLITS = frozenset({"ep", "cp", "tp", "etp"})

#: The tensor-parallel plan of the common attention block (``self_attn`` with q/k/v/o projections), for a family
#: whose config's ``base_model_tp_plan`` names only the experts (many MoE configs do); extend it where the
#: attention has more, e.g. per-head norms shared by the heads (``replicated_with_grad_allreduce``).
ATTENTION_TP_PLAN: Mapping[str, str] = MappingProxyType({
    "model.layers.*.self_attn.q_proj": "colwise",
    "model.layers.*.self_attn.k_proj": "colwise",
    "model.layers.*.self_attn.v_proj": "colwise",
    "model.layers.*.self_attn.o_proj": "rowwise",
})

_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")


def is_valid_family_name(name: object) -> bool:
    """Lower-case letters, digits, '-' and '_', starting with a letter: usable in entry points and package names."""
    return isinstance(name, str) and bool(_NAME.match(name))


def api_version_tuple(version: object) -> tuple[int, int] | None:
    """``(major, minor)`` of a declared plugin API version, ``None`` where it is neither an int nor "MAJOR.MINOR"."""
    if isinstance(version, int) and not isinstance(version, bool):
        return (version, 0)
    if isinstance(version, str) and re.fullmatch(r"\d+\.\d+", version):
        major, minor = version.split(".")
        return (int(major), int(minor))
    return None


def _as_tuple(value: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


@dataclass(frozen=True)
class Family:
    """What a family plugin declares about itself.

    Module paths are patterns over `model.named_modules()` names where `*` stands for
    one path segment (a layer index, say). A pattern may be a tuple of alternatives.
    """

    #: Lower-case letters, digits, '-' and '_', starting with a letter; the entry-point name should be the same.
    name: str
    #: The transformers ``config.model_type`` values the family claims (a string for one).
    model_types: tuple[str, ...]
    #: The plugin's own version.
    version: str
    #: The plugin API the plugin was written against, as a literal (``PLUGIN_API_VERSION`` then): ``"MAJOR.MINOR"``,
    #: or an int for ``"N.0"``.
    api_version: int | str
    #: Subset of ``{"ep", "cp", "tp", "etp"}``; data parallelism (FSDP2) needs no declaration.
    splits: frozenset[str] = frozenset()
    #: Modules that hold a router child and an experts child.
    moe_block: str | tuple[str, ...] = "model.layers.*.mlp"
    #: Child of a MoE block that computes (router_logits, top_k_weights, top_k_index).
    router: str = "gate"
    #: Child of a MoE block with the fused 3-D expert parameters (transformers' experts interface).
    experts: str = "experts"
    #: Attention modules, wrapped for context parallelism and TP head slicing.
    attention: str | tuple[str, ...] = "model.layers.*.self_attn"
    #: Config overrides that make a tiny random model of this family build and run (tests, `show`).
    tiny_config: Mapping[str, Any] = field(default_factory=dict)
    #: transformers class to build the model with, where ``AutoModelForCausalLM`` does not map the config: one name for
    #: every claimed type, or a mapping model type -> name where the types need different classes (a composite's
    #: ``...ForConditionalGeneration`` beside its text part's causal LM); a type the mapping leaves out is built with
    #: ``AutoModelForCausalLM``. ``class_for(model_type)`` reads it.
    model_class: str | Mapping[str, str] | None = None
    #: Tensor-parallel plan (module-name patterns -> ``"colwise"``/``"rowwise"``), where the config's
    #: ``base_model_tp_plan`` is missing or wrong for this family; empty = use the config's.
    tp_plan: Mapping[str, str] = field(default_factory=dict)
    #: False where the routers choose experts without ``torch.topk`` (PhiMoE's sparsemixer samples them), which is
    #: where GRPO's routing replay hooks in: such a family trains GRPO without replay, and the kit checks the claim.
    routing_replay: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_types", _as_tuple(self.model_types))
        object.__setattr__(self, "moe_block", _as_tuple(self.moe_block))
        object.__setattr__(self, "attention", _as_tuple(self.attention))
        object.__setattr__(self, "splits", frozenset(self.splits))
        object.__setattr__(self, "tp_plan", dict(self.tp_plan))  # a plain dict: a shared plan (ATTENTION_TP_PLAN) is read-only, and pickles
        if self.model_class is not None and not isinstance(self.model_class, str):
            object.__setattr__(self, "model_class", dict(self.model_class))
        if not is_valid_family_name(self.name):
            raise ValueError(
                f"Family.name={self.name!r} is not valid: use lower-case letters, digits, '-' or '_', "
                "starting with a letter (e.g. 'qwen3-moe')"
            )
        if not self.model_types or not all(isinstance(t, str) and t for t in self.model_types):
            raise ValueError(
                f"Family.model_types={self.model_types!r} must name at least one transformers model type "
                "(the config's `model_type`, e.g. 'qwen3_moe')"
            )
        unknown = self.splits - SPLITS
        if unknown:
            raise ValueError(
                f"Family.splits has {sorted(unknown)}, which Halo does not know; "
                f"declare a subset of {sorted(SPLITS)} (data parallelism needs no declaration)"
            )
        if isinstance(self.model_class, dict):
            stray = sorted(set(self.model_class) - set(self.model_types))
            if stray or not all(isinstance(v, str) and v for v in self.model_class.values()):
                raise ValueError(
                    f"Family.model_class={self.model_class!r} must map claimed model types {list(self.model_types)} to "
                    f"transformers class names" + (f"; {stray} are not claimed" if stray else "")
                )
        if api_version_tuple(self.api_version) is None:
            raise ValueError(
                f"Family.api_version={self.api_version!r} must be 'MAJOR.MINOR' or an int "
                f"(this core speaks {PLUGIN_API_VERSION!r})"
            )

    def class_for(self, model_type: str) -> str | None:
        """The transformers class ``model_type`` is built with, ``None`` where ``AutoModelForCausalLM`` maps it.

        Why per type: one family can claim a composite and its text part (``qwen3_5_moe`` and ``qwen3_5_moe_text``),
        whose checkpoints differ in layout and need different classes."""
        if isinstance(self.model_class, dict):
            return self.model_class.get(model_type)
        return self.model_class
