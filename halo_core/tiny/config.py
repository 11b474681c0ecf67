"""``tiny_config``: transformers' default config of a model type, shrunk field by field (every rule of this package)."""

from __future__ import annotations

from typing import Any, Mapping

from halo_core.hf_config import text_config
from halo_core.tiny.agreement import _agreeing
from halo_core.tiny.composite import _linked_sizes, _merge, _sub_config_base, _unset_sub_config
from halo_core.tiny.layers import _layer_periods, _layers, _sliding_window
from halo_core.tiny.rotary import _rotary
from halo_core.tiny.sizes import _sizes


#: Per-type gaps in transformers' own defaults that no rule can infer; each says why.
DEFAULT_GAPS: dict[str, dict[str, Any]] = {
    # DbrxAttention reads attn_config.rope_theta, which DbrxAttentionConfig does not declare, and clamps q/k/v to
    # clip_qkv, whose default None torch.clamp refuses (released checkpoints carry both; DBRX's clip_qkv is 8).
    "dbrx": {"attn_config": {"rope_theta": 10000.0, "clip_qkv": 8.0}},
    # The default layer_types include indexed (QSA) layers but leave the indexer's sizes unset (real checkpoints set them).
    "qwen4_exp_text": (_qsa := {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 8, "indexer_budget": 4, "indexer_compress_ratio": 2}),
    "qwen4_exp": {"text_config": _qsa},
    # The talker reads shared_expert_intermediate_size and spatial_merge_size, which its configs do not declare.
    "qwen3_omni_moe": {"talker_config": {"spatial_merge_size": 2, "text_config": {"shared_expert_intermediate_size": 32}}},
}


def _tiny_kwargs(default, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The tiny sizes of ``default`` and its sub-configs; ``overrides`` only steer which layers are kept."""
    overrides = overrides or {}
    fields = default.to_dict()
    aliases = getattr(default, "attribute_map", {})  # e.g. num_experts -> num_local_experts
    kwargs = _sizes(fields, aliases)
    kwargs.update(_layers(default, fields, aliases, kwargs.get(aliases.get("num_hidden_layers", "num_hidden_layers")), overrides))
    kwargs.update(_rotary(default, fields, kwargs))
    kwargs.update(_layer_periods(fields))
    kwargs.update(_sliding_window(fields, kwargs))
    text = text_config(default)
    for name in getattr(default, "sub_configs", None) or {}:  # composite models: shrink the text (and other) parts too
        sub = getattr(default, name, None)
        if sub is None and isinstance(overrides.get(name), dict):
            sub = _unset_sub_config(default, name)
        if sub is not None and hasattr(sub, "to_dict"):
            # the text part also gets the top-level overrides its composite lacks (as ``_merge`` routes them)
            routed = {k: v for k, v in overrides.items() if k not in fields} if sub is text else {}
            given = overrides.get(name) if isinstance(overrides.get(name), dict) else {}
            kwargs[name] = {**_sub_config_base(sub), "model_type": sub.model_type, **_tiny_kwargs(sub, {**routed, **given})}
    return kwargs


def tiny_config(model_type: str, overrides: Mapping[str, Any] | None = None):
    """A transformers config of ``model_type`` at toy size (``overrides`` win)."""
    from transformers import AutoConfig

    default = AutoConfig.for_model(model_type)
    kwargs = _tiny_kwargs(default, {**DEFAULT_GAPS.get(model_type, {}), **(overrides or {})})
    _linked_sizes(default, kwargs)
    kwargs = _merge(kwargs, DEFAULT_GAPS.get(model_type, {}), default)
    kwargs = _merge(kwargs, overrides or {}, default)
    # Rebuilding (rather than setting attributes) lets __init__ derive dependent fields such as layer_types.
    for _ in range(4):
        try:
            return AutoConfig.for_model(model_type, **kwargs)
        except Exception as exc:  # a validator that names two fields which must agree: make them agree, once each
            patched = _agreeing(default, kwargs, str(exc))
            if patched is None:
                raise
            kwargs = patched
    return AutoConfig.for_model(model_type, **kwargs)
