"""A run's LoRA keys: TRL's own ``ModelConfig`` fields, so a TRL user's YAML trains under ``halo launch`` unchanged."""

from __future__ import annotations

#: The ``trl.ModelConfig`` fields a run may set (the rest of ``ModelConfig`` is Halo's own or the method's).
KEYS = (
    "use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_target_parameters", "lora_modules_to_save",
    "lora_task_type", "use_rslora", "use_dora", "load_in_8bit", "load_in_4bit", "bnb_4bit_quant_type", "use_bnb_nested_quant",
    "bnb_4bit_quant_storage",
)


#: The splits LoRA runs under (its launcher tests prove each against one process); the others are refused before start.
SPLITS = frozenset({"ep", "cp", "tp", "etp"})


def type_hints() -> dict:
    import typing

    from trl import ModelConfig

    hints = typing.get_type_hints(ModelConfig)
    return {key: hints[key] for key in KEYS}


def model_config(fields: dict):
    """``trl.ModelConfig`` as TRL's scripts build it from these keys (one target module becomes a string: ``all-linear``)."""
    from trl import ModelConfig

    return ModelConfig(**fields)


def lora_config(fields: dict):
    """The ``peft.LoraConfig`` TRL builds from these keys (``trl.get_peft_config``), or ``None`` without ``use_peft``.

    One plain module name stays a name: ``ModelConfig`` turns a one-entry ``lora_target_modules`` into a string
    (for ``all-linear``), which PEFT would then read as a regular expression over whole module names, so
    ``[q_proj]`` would match nothing."""
    import re

    from trl import get_peft_config

    if not fields.get("use_peft"):
        return None
    args = model_config(fields)
    target = args.lora_target_modules
    if isinstance(target, str) and target != "all-linear" and re.fullmatch(r"[\w.]+", target):
        args.lora_target_modules = [target]
    return get_peft_config(args)
