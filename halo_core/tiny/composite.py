"""Composite configs (text, vision, audio ...): sub-configs rebuilt, overrides routed and merged, linked widths shrunk."""

from __future__ import annotations

import re
from typing import Any, Mapping

from halo_core.hf_config import text_config


def _sub_config_base(sub) -> dict[str, Any]:
    """What a composite's defaults set on a sub-config beyond the sub-config class's own defaults (nemotron_h_omni's
    ``vision_config.video_temporal_patch_size``), so a rebuilt sub-config keeps it."""
    try:
        own = type(sub)().to_dict()
    except Exception:
        return {}
    skip = {"transformers_version", "architectures", "_name_or_path"}
    return {k: v for k, v in sub.to_dict().items() if k not in skip and k in own and own[k] != v and not isinstance(v, dict)}


def _unset_sub_config(default, name: str):
    """The default of an optional sub-config that ``default`` leaves unset (Gemma 4's ``vision_config`` and
    ``audio_config`` are ``None``: the text-only checkpoints have no towers), built where overrides ask for it by giving
    a dict, so that it is shrunk like any other part instead of built at full size; ``None`` if it cannot be built."""
    spec = (getattr(default, "sub_configs", None) or {}).get(name)
    spec = getattr(spec, "config_class", spec)
    try:
        return spec() if isinstance(spec, type) else None
    except Exception:
        return None


def _merge(kwargs: dict, overrides: Mapping[str, Any], default) -> dict:
    """``overrides`` over ``kwargs``: a sub-config field by field; a field only the text sub-config has goes there
    (so the kit's ``num_experts_per_tok`` reaches a vision-language model's language model)."""
    kwargs = dict(kwargs)
    aliases = getattr(default, "attribute_map", {})
    sub_configs = set(getattr(default, "sub_configs", None) or {})
    fields = default.to_dict()
    text = text_config(default)
    text_name = next((n for n in sub_configs if getattr(default, n, None) is text), None) if text is not default else None
    for key, value in overrides.items():
        key = aliases.get(key, key)
        if isinstance(value, dict) and key.endswith("_config") and key not in sub_configs:
            continue  # a sub-config override applies to the model types that have that sub-config
        if text_name and key not in fields and not hasattr(default, key) and key in text.to_dict():
            kwargs[text_name] = {**kwargs.get(text_name, {}), key: value}
            continue
        kwargs[key] = _deep_merge(kwargs[key], value) if isinstance(kwargs.get(key), dict) else value  # a sub-config: field by field
    return kwargs


def _deep_merge(base: dict, value):
    if not isinstance(value, dict):
        return value
    return {**base, **{k: _deep_merge(base[k], v) if isinstance(base.get(k), dict) else v for k, v in value.items()}}


#: Fields that carry another config's hidden size across a composite (an adapter's in/out width, a projector's,
#: ``vision_config.text_hidden_size``): where the default equals a config's default ``hidden_size`` they follow it.
_LINKED_SIZE = re.compile(r"(hidden|_dim$|_in_|_out_|input|output)")


def _nodes(config, node: dict) -> list[tuple[Any, dict]]:
    """(default config, its kwargs) for a config and every sub-config below it, outermost first."""
    found = [(config, node)]
    for name in getattr(config, "sub_configs", None) or {}:
        sub = getattr(config, name, None)
        if sub is None and isinstance(node.get(name), dict):
            sub = _unset_sub_config(config, name)
        if hasattr(sub, "to_dict") and isinstance(node.get(name), dict):
            found += _nodes(sub, node[name])
    return found


def _linked_sizes(default, kwargs: dict) -> None:
    """Shrink, in place, the fields ``_LINKED_SIZE`` names whose default is some config's default hidden size."""
    nodes = _nodes(default, kwargs)
    hidden = {}
    for config, node in nodes:
        key = getattr(config, "attribute_map", {}).get("hidden_size", "hidden_size")
        if isinstance(config.to_dict().get(key), int) and isinstance(node.get(key), int):
            hidden[config.to_dict()[key]] = node[key]
    for config, node in nodes:
        for key, value in config.to_dict().items():
            if (key not in node and type(value) is int and value in hidden and _LINKED_SIZE.search(key)
                    and "head" not in key and "intermediate" not in key and "position" not in key):
                node[key] = hidden[value]
