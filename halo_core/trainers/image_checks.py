"""Refusals for image rows before any process starts: each one line naming the field, the value and the fix.

A dataset source with an ``images`` (or ``image``) column is image data, as TRL's SFTTrainer reads it. Every
rank would otherwise fail on it at once, or, worse, train wrongly: TRL refuses images for a text-only model
and packing only inside each worker; CP and TP split token rows that the image patches are not split with; and a
rank whose batch held no image would skip the vision tower's FSDP2 gathers that the other ranks make.
"""

from __future__ import annotations

from pathlib import Path

from halo_core.errors import ConfigError
from halo_core.trainers.parts.data import first_rows, image_paths, local_columns
from halo_core.trainers.parts.processor import IMAGE_COLUMNS, PROCESSOR_FILES, is_vision_language
from halo_core.trainers.run_config import RunConfig, model_config_of

#: The columns TRL's vision collator reads a row's text from (besides the images).
TEXT_FORMATS = (("messages",), ("prompt", "completion"), ("text",))


def check_images(run: RunConfig, method, args, world: int = 1, plan=None) -> None:
    """Every local source with image columns, against the method, the model, the layout and TRL's vision rules.
    ``plan``: the launch's ``RunPlan``, whose model config is read once for all the checks."""
    for source in run.halo.dataset:
        columns = local_columns(source)
        found = [c for c in IMAGE_COLUMNS if columns and c in columns]
        if not found:
            continue
        where = f"{run.source}: dataset {source.path!r} has images (column {found[0]!r})"
        if not method.images:
            raise ConfigError(f"{where}, and method {run.method!r} trains on text only in Halo; train image rows with "
                              f"`halo launch sft`, or remove the column")
        _check_model(run, where, plan.model_config if plan is not None else model_config_of(run))
        _check_settings(run, args, where)
        if not any(all(c in columns for c in needed) for needed in TEXT_FORMATS):
            raise ConfigError(f"{where} but no text for them: TRL's vision collator reads 'messages', 'prompt' and 'completion', "
                              f"or 'text' (it has {sorted(columns)}); rename a column with the source's rename_columns: {{old: new}}")
        _check_rows(run, source, found, world)


def _check_model(run: RunConfig, where: str, config) -> None:
    if config is None:
        return  # a hub id: TRL checks it when the worker loads it
    model = run.halo.model_name_or_path
    if not is_vision_language(config):
        raise ConfigError(f"{where}, but model_name_or_path {model!r} is a text-only model ({config.model_type}: its config has no "
                          f"vision_config); train image rows on a vision-language model (qwen3_vl_moe, glm4v_moe, ...), or remove the "
                          f"column to train on the text")
    if not any((Path(model) / name).is_file() for name in PROCESSOR_FILES):
        raise ConfigError(f"{where}, but model_name_or_path {model!r} has no processor settings ({' or '.join(PROCESSOR_FILES)}), "
                          f"which TRL's vision collator needs; save the processor of the model it comes from into it: "
                          f"AutoProcessor.from_pretrained(ID).save_pretrained(FOLDER)")


def _check_settings(run: RunConfig, args, where: str) -> None:
    halo = run.halo
    for field, value in (("context_parallel_size", halo.context_parallel_size), ("tensor_parallel_size", halo.tensor_parallel_size)):
        if value > 1:
            raise ConfigError(f"{where}: {field}={value} splits each sample's tokens (or heads) over ranks, and the image patches "
                              f"are not split with them; set {field}: 1 (images train under expert_parallel_size and FSDP2)")
    if getattr(args, "packing", False):
        raise ConfigError(f"{where}: packing: true is not supported for image rows (TRL's vision collator pads each batch); "
                          f"set packing: false")
    if getattr(args, "padding_free", False):
        raise ConfigError(f"{where}: padding_free: true is not supported for image rows (TRL's vision collator pads each batch); "
                          f"set padding_free: false")
    if getattr(args, "max_length", None) is not None and getattr(args, "truncation_mode", None) == "keep_end":
        raise ConfigError(f"{where}: truncation_mode: keep_end could cut the image tokens at the start off their pixels; "
                          f"set truncation_mode: keep_start, or max_length: null")
    if run.peft.get("use_peft"):
        raise ConfigError(f"{where}: use_peft: true on a vision-language model is not supported by Halo yet (its adapters "
                          f"are proven on text models only); train every weight (remove use_peft), or train text rows")


def _check_rows(run: RunConfig, source, found: list[str], world: int) -> None:
    """A JSON Lines source's image paths (relative to the file) exist, and at more than one process every row has one."""
    rows = first_rows(source, count=None)
    if rows is None:
        return
    folder, seen = Path(source.path).parent, set()
    for index, row in enumerate(rows):
        where = f"{run.source}: dataset {source.path!r} row {index + 1}"
        values = [v for column in found for v in (row.get(column) if isinstance(row.get(column), list) else [row.get(column)]) if v is not None]
        if not values and world > 1:
            raise ConfigError(f"{where} has no image; at more than one process every row needs one (a rank whose batch held none "
                              f"would skip the vision tower's FSDP2 gathers the other ranks make); drop the row, or train on --nproc 1")
        for value, path in zip(values, image_paths(values, folder)):
            if not isinstance(value, str):
                raise ConfigError(f"{where}: {found[0]} holds {value!r}; a JSON Lines source names each image by its file path "
                                  f"(relative to the file), e.g. \"images\": [\"images/cat.png\"]")
            if path not in seen and not Path(path).is_file():
                raise ConfigError(f"{where}: image {value!r} does not exist (looked for {path}); image paths are relative to "
                                  f"the JSON Lines file's folder")
            seen.add(path)
