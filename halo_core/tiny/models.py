"""Tiny random-initialised models, from ``tiny_config``."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from halo_core.tiny.config import tiny_config


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
    """``tiny_model`` with the family's own tiny-config overrides (``overrides`` win) and its class for ``model_type``."""
    return tiny_model(model_type, {**family.tiny_config, **(overrides or {})}, model_class=family.class_for(model_type), **kwargs)
