"""Tiny random-initialised models of any transformers model type, for tests and `halo families show`.

No downloads: the config comes from transformers' defaults for the model type, shrunk
field by field; a family adds overrides where its config needs them.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from halo_core.hf_config import text_config

#: Sizes that make a model build and run in milliseconds on a CPU. Applied only to fields the
#: config actually has, so a family's config never grows unknown attributes.
TINY_SIZES: dict[str, Any] = {
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "num_experts": 8,
    "num_local_experts": 8,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "num_experts_per_token": 2,
    "kv_lora_rank": 16,
    "q_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 8,
    "linear_num_heads": 4,
    "linear_head_dim": 8,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "first_k_dense_replace": 1,
    "num_dense_layers": 1,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


#: Names transformers configs use for the number of experts per token.
TOP_K_KEYS = ("num_experts_per_tok", "num_experts_per_token", "top_k_experts", "moe_topk")


def top_k_key(model_type: str) -> str | None:
    """The field holding experts-per-token in ``model_type``'s (text) config."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type)
    config = text_config(config)
    fields = config.to_dict()
    return next((k for k in TOP_K_KEYS if k in fields), None)


def config_top_k(config) -> int:
    config = text_config(config)
    return next(getattr(config, k) for k in TOP_K_KEYS if getattr(config, k, None))


def _tiny_kwargs(default) -> dict[str, Any]:
    fields = default.to_dict()
    aliases = getattr(default, "attribute_map", {})  # e.g. num_experts -> num_local_experts
    kwargs = {}
    for key, value in TINY_SIZES.items():
        key = aliases.get(key, key)
        if fields.get(key) is not None:  # only sizes the config has (a None rank means "feature off")
            kwargs[key] = value
    if fields.get("kv_lora_rank") is not None and "num_key_value_heads" in kwargs:
        kwargs["num_key_value_heads"] = kwargs["num_attention_heads"]  # latent attention (MLA) has one KV head per head
    for name in getattr(default, "sub_configs", None) or {}:  # composite models: shrink the text (and other) parts too
        sub = getattr(default, name, None)
        if sub is not None and hasattr(sub, "to_dict"):
            kwargs[name] = {"model_type": sub.model_type, **_tiny_kwargs(sub)}
    return kwargs


def tiny_config(model_type: str, overrides: Mapping[str, Any] | None = None):
    """A transformers config of ``model_type`` at toy size (``overrides`` win)."""
    from transformers import AutoConfig

    default = AutoConfig.for_model(model_type)
    aliases = getattr(default, "attribute_map", {})
    kwargs = _tiny_kwargs(default)
    sub_configs = set(getattr(default, "sub_configs", None) or {})
    for key, value in (overrides or {}).items():
        key = aliases.get(key, key)
        if isinstance(value, dict) and key.endswith("_config") and key not in sub_configs:
            continue  # a sub-config override applies to the model types that have that sub-config
        merge = isinstance(value, dict) and isinstance(kwargs.get(key), dict)  # a sub-config: override field by field
        kwargs[key] = {**kwargs[key], **value} if merge else value
    # Rebuilding (rather than setting attributes) lets __init__ derive dependent fields such as layer_types.
    return AutoConfig.for_model(model_type, **kwargs)


def tiny_model(model_type: str, overrides: Mapping[str, Any] | None = None, *, seed: int = 0, device: str | torch.device = "cpu", model_class: str | None = None):
    """A float32 causal-LM of ``model_type`` with random weights drawn from ``seed``.

    ``model_class`` names the transformers class where ``AutoModelForCausalLM`` does not map the config.
    """
    import transformers

    config = tiny_config(model_type, overrides)
    torch.manual_seed(seed)
    with torch.device(device):
        if model_class:
            model = getattr(transformers, model_class)._from_config(config, dtype=torch.float32)
        else:
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()


def tiny_family_model(family, model_type: str, overrides: Mapping[str, Any] | None = None, **kwargs):
    """``tiny_model`` with the family's own tiny-config overrides (``overrides`` win) and model class."""
    return tiny_model(model_type, {**family.tiny_config, **(overrides or {})}, model_class=family.model_class, **kwargs)
