"""Reading Hugging Face configs the same way everywhere."""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

#: transformers' auto mappings whose classes put a language-model head (logits over the vocabulary) on a config,
#: in the order ``language_model_class`` prefers them: a decoder-only class first, then a vision-language or
#: multimodal one trained on text alone, then an encoder-decoder one.
LM_MAPPINGS = (
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
    "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES",
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
)
#: Class-name endings of language-model heads in a modeling module, for a config no auto mapping names.
LM_HEAD_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration")


#: Config fields that count experts: a model type whose (text) config has one of them is an MoE type.
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts")


def counts_experts(config) -> bool:
    """Whether ``config`` (or its text part, or one nested sub-config: DBRX's ``ffn_config``) has an expert-count
    field. Its presence decides, not its value (``hunyuan_v1_moe``'s default is 1, ``dots1``'s ``None``)."""
    fields = {**config.to_dict(), **text_config(config).to_dict()}
    nested = [v for v in fields.values() if isinstance(v, dict)]
    return any(key in f for f in (fields, *nested) for key in EXPERT_COUNT_KEYS)


def text_config(config):
    """The language model's config: a composite (vision-language) config's text part, else the config itself."""
    getter = getattr(config, "get_text_config", None)
    return getter() if getter else config


@dataclass(frozen=True)
class LanguageModelClass:
    """How transformers builds a language model of one model type.

    ``name``: the class, ``None`` where ``AutoModelForCausalLM`` maps the config (no ``model_class`` needed);
    ``found``: where it came from (an auto mapping, or the modeling module); ``missing``: why there is none
    (``name`` and ``found`` are then ``None``), naming the classes transformers has for the config and the
    composite types whose part it is."""

    name: str | None
    found: str | None
    missing: str | None = None


def _modeling_classes(config_class) -> dict[str, type]:
    """The model classes of ``config_class``'s modeling module that take that config, by name."""
    import transformers

    try:
        module = importlib.import_module(config_class.__module__.replace(".configuration_", ".modeling_"))
    except ImportError:
        return {}
    return {name: cls for name, cls in vars(module).items()
            if inspect.isclass(cls) and issubclass(cls, transformers.PreTrainedModel) and cls.config_class is config_class
            and not name.endswith("PreTrainedModel")}


def _no_lm_loss(cls) -> str | None:
    """Why ``cls`` cannot train on a language-model loss from ``labels``, or ``None`` where it can: a composite that
    only generates (``Qwen3OmniMoeForConditionalGeneration``), a diffusion model that takes no labels."""
    import torch

    forward = cls.forward
    if forward is torch.nn.Module.forward or getattr(forward, "__name__", "") == "_forward_unimplemented":
        return f"`{cls.__name__}` has no forward (it only generates)"
    if "labels" not in inspect.signature(forward).parameters:
        return f"`{cls.__name__}.forward` takes no labels (no language-model loss to train on)"
    return None


def composites_of(model_type: str) -> list[str]:
    """Model types whose config holds ``model_type``'s as a sub-config (``qwen3_vl_moe`` for ``qwen3_vl_moe_text``)."""
    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    found = []
    for other, cls in CONFIG_MAPPING.items():
        subs = getattr(cls, "sub_configs", None) or {}
        if other != model_type and any(getattr(s, "config_class", s) is config_class for s in subs.values()):
            found.append(other)
    return found


def language_model_class(model_type: str) -> LanguageModelClass:
    """The transformers class to build (and train as a causal LM) a model of ``model_type`` with."""
    import transformers
    from transformers import CONFIG_MAPPING
    from transformers.models.auto import modeling_auto
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    found = None
    if model_type not in CONFIG_MAPPING_NAMES and CONFIG_MAPPING[model_type] in transformers.MODEL_FOR_CAUSAL_LM_MAPPING:
        # a model's own code, registered (``AutoModelForCausalLM.register``: remote code, or a plugin's copy of it)
        return LanguageModelClass(None, "AutoModelForCausalLM.register")
    for mapping in LM_MAPPINGS:
        name = getattr(modeling_auto, mapping, {}).get(model_type)
        if name and (mapping == LM_MAPPINGS[0] or hasattr(transformers, name)):
            found = LanguageModelClass(None if mapping == LM_MAPPINGS[0] else name, mapping)
            break
    classes = _modeling_classes(CONFIG_MAPPING[model_type])
    for name in classes if found is None else ():
        if name.endswith(LM_HEAD_SUFFIXES) and hasattr(transformers, name):
            found = LanguageModelClass(name, "modeling module")
            break
    if found is not None:
        cls = getattr(transformers, name, None)
        why = _no_lm_loss(cls) if cls is not None else None
        if why is None:
            return found
        subs = (getattr(CONFIG_MAPPING[model_type], "sub_configs", None) or {}).values()
        parts = sorted(t for t in {getattr(s, "model_type", "") for s in subs} - {"", model_type} if language_model_class(t).missing is None)
        return LanguageModelClass(None, None, f"{why}{'; scaffold the part that trains (' + ', '.join(parts) + ')' if parts else ''}")
    parents = composites_of(model_type)
    has = ", ".join(sorted(classes)) or "no model class"
    hint = f"; scaffold the model type it is part of ({', '.join(parents)}) instead" if parents else ""
    return LanguageModelClass(None, None, f"transformers has {has} for `{model_type}`, none with a language-model head{hint}")
