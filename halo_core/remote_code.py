"""Models that ship their own modeling code (``config.json``'s ``auto_map``), as transformers decides it.

transformers runs a folder's code only where its ``model_type`` is unknown to it (a known type keeps transformers'
own classes) and the user passed ``trust_remote_code=True``; without the key it asks ``Do you wish to run the custom
code? [y/N]`` on standard input, which inside a launcher's workers hangs or fails far from the cause. Halo asks the
question before any process starts: such a model is refused in one line naming ``trust_remote_code`` (TRL's key,
false by default). With the key, the folder's classes are registered with transformers' auto classes
(``AutoConfig.register``, ``AutoModelForCausalLM.register``: its public API for custom models), in the launcher and in
every worker, so every later ``AutoConfig.from_pretrained`` and the family registry see the model type, and
``register_for_auto_class`` makes ``save_pretrained`` copy the code files beside the saved weights.
"""

from __future__ import annotations

import json
from pathlib import Path

from halo_core.errors import ConfigError

KEY = "trust_remote_code"
#: The auto classes whose ``auto_map`` entries Halo registers (the heads its methods build).
AUTO_CLASSES = ("AutoModelForCausalLM", "AutoModel", "AutoModelForSequenceClassification")


def config_dict(path: str | Path) -> dict | None:
    """``path``'s ``config.json`` as a dict (a local folder, or a hub id's cached copy), ``None`` where there is none."""
    folder = Path(path)
    if folder.is_dir():
        file = folder / "config.json"
    else:
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(str(path), "config.json")
        except Exception:  # noqa: BLE001 - not a hub id: the model-source check names what is wrong
            return None
        if not isinstance(cached, str):
            return None
        file = Path(cached)
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError):
        return None


def ships_code(config: dict | None) -> bool:
    """Whether transformers would build this config from the folder's own code: ``auto_map`` names an ``AutoConfig``
    and the installed transformers does not know the ``model_type`` (its own mapping, not types registered later)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if not config or "AutoConfig" not in (config.get("auto_map") or {}):
        return False
    return config.get("model_type") not in CONFIG_MAPPING_NAMES


def model_paths(run) -> list[tuple[str, str]]:
    """The models a run builds from a path, as (key, path): the policy, and a distill teacher."""
    paths = [("model_name_or_path", run.halo.model_name_or_path)]
    teacher = run.trainer.get("teacher_model_name_or_path")
    if teacher:
        paths.append(("teacher_model_name_or_path", teacher))
    return paths


def trusted(run) -> bool:
    return bool(run.trainer.get(KEY, False))


def admit(run) -> None:
    """Refuse (one line) a model that ships code the run does not trust; register the code of those it does."""
    for key, path in model_paths(run):
        config = config_dict(path)
        if not ships_code(config):
            continue
        if not trusted(run):
            raise ConfigError(
                f"{run.source}: {key} {path!r} ships its own modeling code (config.json auto_map; model_type "
                f"{config.get('model_type')!r} is unknown to the installed transformers), which runs only with "
                f"{KEY}: true; set it once you have read and trust that code"
            )
        register_folder(path, config)


def register_folder(path: str | Path, config: dict | None = None) -> None:
    """Register the folder's own classes with transformers' auto classes, as ``from_pretrained(...,
    trust_remote_code=True)`` would load them; they replace a plugin's copy (transformers prefers the folder's code
    where it is trusted)."""
    import transformers
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    config = config if config is not None else config_dict(path)
    auto_map = config["auto_map"]
    config_class = get_class_from_dynamic_module(auto_map["AutoConfig"], str(path))
    models = {auto: get_class_from_dynamic_module(auto_map[auto], str(path)) for auto in AUTO_CLASSES if auto in auto_map}
    register_classes(config_class, models, replace=True)


def register_classes(config_class, models: dict, *, replace: bool = False) -> None:
    """``config_class`` under its ``model_type`` and each ``{auto class name: model class}`` with transformers, as a
    remote-code load does (``register_for_auto_class``: ``save_pretrained`` copies their files and writes
    ``auto_map``). ``replace=False`` (a plugin that ships a copy of the code) leaves a type already registered alone."""
    import transformers
    from transformers import CONFIG_MAPPING

    model_type = config_class.model_type
    if model_type in CONFIG_MAPPING and not replace:
        return
    transformers.AutoConfig.register(model_type, config_class, exist_ok=True)
    config_class.register_for_auto_class()
    for auto, model_class in models.items():
        getattr(transformers, auto).register(config_class, model_class, exist_ok=True)
        model_class.register_for_auto_class(auto)
