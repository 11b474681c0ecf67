"""Experts per token: where a model type's config holds it, and the overrides that set it (the kit's top-k)."""

from __future__ import annotations

from typing import Any

from halo_core.hf_config import text_config
from halo_core.tiny.sizes import TOP_K_KEYS


def _top_k_place(model_type: str) -> tuple[str | None, str] | None:
    """Where ``model_type``'s (text) config holds experts-per-token: (sub-config key or ``None``, field)."""
    from transformers import AutoConfig

    config = text_config(AutoConfig.for_model(model_type))
    fields = config.to_dict()
    places = [(None, fields)] + [(sub, fields[sub]) for sub in getattr(config, "sub_configs", {}) if isinstance(fields.get(sub), dict)]
    return next(((sub, k) for sub, found in places for k in TOP_K_KEYS if k in found), None)


def top_k_key(model_type: str) -> str | None:
    """The field holding experts-per-token in ``model_type``'s (text) config, or in one of its sub-configs
    (DBRX's ``ffn_config.moe_top_k``)."""
    place = _top_k_place(model_type)
    return place[1] if place else None


def top_k_override(model_type: str, top_k: int) -> dict[str, Any]:
    """The ``tiny_model`` overrides that set experts-per-token to ``top_k`` (nested for a sub-config's field)."""
    place = _top_k_place(model_type)
    if place is None:
        return {}
    sub, key = place
    return {key: top_k} if sub is None else {sub: {key: top_k}}


def config_top_k(config) -> int:
    config = text_config(config)
    subs = [getattr(config, sub, None) for sub in getattr(config, "sub_configs", {})]
    return next(getattr(c, k) for c in (config, *subs) if c is not None for k in TOP_K_KEYS if getattr(c, k, None))
