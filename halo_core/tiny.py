"""Tiny random-initialised models of any transformers model type, for tests and `halo families show`.

No downloads: the config comes from transformers' defaults for the model type, shrunk
field by field; a family adds overrides where its config needs them.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

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
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def tiny_config(model_type: str, overrides: Mapping[str, Any] | None = None):
    """A transformers config of ``model_type`` at toy size (``overrides`` win)."""
    from transformers import AutoConfig

    default = AutoConfig.for_model(model_type)
    fields = default.to_dict()
    aliases = getattr(default, "attribute_map", {})  # e.g. num_experts -> num_local_experts
    kwargs = {}
    for key, value in [*TINY_SIZES.items(), *(overrides or {}).items()]:
        key = aliases.get(key, key)
        if key in fields or key in (overrides or {}):
            kwargs[key] = value
    # Rebuilding (rather than setting attributes) lets __init__ derive dependent fields such as layer_types.
    return AutoConfig.for_model(model_type, **kwargs)


def tiny_model(model_type: str, overrides: Mapping[str, Any] | None = None, *, seed: int = 0, device: str | torch.device = "cpu"):
    """A float32 causal-LM of ``model_type`` with random weights drawn from ``seed``."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(model_type, overrides)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()
