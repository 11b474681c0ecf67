"""PEFT's parts Halo's LoRA uses beyond ``inject_adapter_in_model`` and ``LoraConfig``: the conversion of a config for
transformers 5's fused MoE layouts (so targets mean what they mean to PEFT itself), and its target-matching helpers."""

from __future__ import annotations

from halo_core.integrations import Seam, check

SEAMS = (
    # lora/inject.py converts the run's LoraConfig as PEFT converts it before injecting (all-linear, v4 names).
    Seam("peft.utils.transformers_weight_conversion", "convert_peft_config_for_transformers",
         ("peft_config", "model", "conversions")),
    Seam("peft.utils.transformers_weight_conversion", "get_model_conversion_mapping", ("model",)),
    # rank_pattern / alpha_pattern keys matched as PEFT matches them (lora/inject.py).
    Seam("peft.utils.other", "get_pattern_key", ("pattern_keys", "key_to_match")),
    Seam("peft.utils.constants", "TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING"),
    # lora/merge_stream.py merges an adapter layer by layer, reading PEFT's own wrappers and dtype cast.
    Seam("peft.tuners.tuners_utils", "cast_adapter_dtype", ("model", "adapter_name", "autocast_adapter_dtype")),
    Seam("peft.tuners.lora", "ParamWrapper"),
    Seam("peft.utils.other", "ModulesToSaveWrapper"),
    Seam("peft.utils.other", "TrainableTokensWrapper"),
)

check("peft", SEAMS)

from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING  # noqa: E402  (checked above)
from peft.utils.other import get_pattern_key  # noqa: E402
from peft.utils.transformers_weight_conversion import (  # noqa: E402
    convert_peft_config_for_transformers,
    get_model_conversion_mapping,
)

__all__ = ["TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING", "convert_peft_config_for_transformers",
           "get_model_conversion_mapping", "get_pattern_key"]
