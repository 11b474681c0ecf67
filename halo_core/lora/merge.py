"""``halo export --merge``: an adapter folder merged into its base, written as a plain Hugging Face checkpoint, in
bounded memory.

The output is what ``PeftModel.from_pretrained(Auto*.from_pretrained(base), adapter).merge_and_unload()`` and
``save_pretrained`` write (same keys, shapes, dtypes and values), but the base is never loaded whole: it is built on
the meta device (``merge_base``), and the saved groups of tensors (``conversion_save``: transformers' own layout on
disk, one tensor per expert where the model type stores them so) are made one at a time, each from the base tensors
it needs, read as transformers' conversion mapping says and merged by PEFT's own layers (``merge_stream``), and written
with Halo's writer (``sharded_save``) before the next is made. Memory: the adapter plus a few times the largest group
(its base tensors as read, as converted, PEFT's delta, as written: about five times it, measured), never the model.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from halo_core.errors import ConfigError

if TYPE_CHECKING:
    from halo_core.lora.merge_base import Base
    from halo_core.lora.merge_stream import MergedWeights
    from halo_core.parallel.sharded_save import Job

#: The run's tokenizer files, copied beside the merged weights as they are.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def merge(adapter_dir: str | Path, out_dir: str | Path, *, max_file_bytes: int | None = None) -> Path:
    """``adapter_dir``'s adapter merged into the base its ``adapter_config.json`` names, written into ``out_dir``
    (files of at most ``max_file_bytes``, ``save_pretrained``'s default 50 GB, and an index where there are several)."""
    from halo_core.lora import merge_base, peft_format
    from halo_core.lora.merge_stream import MergedWeights, load_adapter
    from halo_core.parallel import manifest
    from halo_core.parallel.sharded_save import write
    from halo_core.trainers.parts.checkpoint import STAGING_PREFIX, publish

    adapter_dir, out_dir = Path(adapter_dir), Path(out_dir)
    if not peft_format.is_adapter_folder(adapter_dir):
        raise ConfigError(f"{adapter_dir} holds no adapter ({peft_format.ADAPTER_CONFIG} and {peft_format.ADAPTER_WEIGHTS}); "
                          f"give the output_dir of a run with use_peft: true, or one of its checkpoint-N folders")
    config = peft_format.read_config(adapter_dir)
    name = config.get("base_model_name_or_path")
    if not name:
        raise ConfigError(f"{adapter_dir}/{peft_format.ADAPTER_CONFIG} names no base_model_name_or_path; set it to the base model's folder or hub id")
    name = _base_of(name, adapter_dir)
    dtype = torch.float32 if _stored_dtype(adapter_dir) == torch.float32 else "auto"
    base = merge_base.load(name, dtype, sequence_classification=config.get("task_type") == "SEQ_CLS")
    job = merged_job(base, MergedWeights(base, load_adapter(base, adapter_dir)), max_file_bytes)
    staging = out_dir.parent / f".{out_dir.name}.{STAGING_PREFIX}merge"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    _write_config(base.model, staging)
    records = write(job, staging)
    for file in TOKENIZER_FILES:
        if (adapter_dir / file).exists():
            shutil.copy(adapter_dir / file, staging / file)
    manifest.write(staging, records)
    publish(staging, out_dir)
    return out_dir


def merged_job(base: Base, weights: MergedWeights, max_file_bytes: int | None = None) -> Job:
    """The merged model's files as ``save_pretrained`` lays them out, and a generator making and yielding each saved
    group's tensors in turn (``weights.take``), so at most one group is held while it is written."""
    from halo_core.lora.merge_base import saved_names
    from halo_core.parallel.conversion_save import revert, saved_groups, saved_layout
    from halo_core.parallel.safetensors_parallel import MAX_FILE_BYTES, plan_files
    from halo_core.parallel.sharded_save import Job, Write, index_file

    model = base.model
    names = saved_names(model)
    state = model.state_dict()
    groups = saved_groups(model, names)
    layout = saved_layout(model, groups, {n: tuple(state[n].shape) for n in names}, base.dtypes)
    files = plan_files(layout, "model", max_file_bytes or MAX_FILE_BYTES)
    file_of = {key: f.name for f in files for key in f.tensors}

    def parts():
        for group in groups:
            tensors = {n: weights.take(n) for n in group.names}
            for key, tensor in revert(group, tensors, model).items():
                expected = layout[key]
                if tuple(tensor.shape) != expected[0] or tensor.dtype != expected[1]:
                    raise RuntimeError(f"{key}: merged {tuple(tensor.shape)} {tensor.dtype}, but the file was laid out for {expected}")
                yield Write(file_of[key], key, (0,) * tensor.dim(), tensor)
            del tensors

    return Job(files, parts, extra=index_file(files))


def _base_of(name: str, adapter_dir: Path) -> str:
    """The base to merge onto: a random-init run's adapter names its own ``base/`` by the absolute path it had when
    trained, so a run moved or copied since merges onto the ``base/`` it carries (beside the adapter, or beside a
    ``checkpoint-N``'s run); a relative path is read against the adapter's folder; a hub id is left to transformers."""
    own = next((p for p in (adapter_dir / "base", adapter_dir.parent / "base") if (p / "config.json").exists()), None)
    if own is not None and Path(name).name == "base" and name.startswith(("/", ".", "~")):
        return str(own)
    if Path(name).is_dir() or not name.startswith(("/", ".", "~")):
        return name
    beside = adapter_dir / name
    if beside.is_dir():
        return str(beside)
    raise ConfigError(f"the adapter's base {name} (adapter_config.json: base_model_name_or_path) is not a folder; set "
                      f"base_model_name_or_path in {adapter_dir}/adapter_config.json to the base's folder or hub id")


def _write_config(model, folder: Path) -> None:
    """config.json and generation_config.json as ``save_pretrained`` writes them (its empty weights file removed: the
    job writes the weights)."""
    from halo_core.trainers.parts.checkpoint import _WEIGHTS

    model.save_pretrained(folder, state_dict={})
    for path in folder.iterdir():
        if _WEIGHTS.fullmatch(path.name):
            path.unlink()


def _stored_dtype(adapter_dir: Path):
    from safetensors import safe_open

    from halo_core.lora.peft_format import ADAPTER_WEIGHTS

    with safe_open(str(adapter_dir / ADAPTER_WEIGHTS), "pt") as handle:
        keys = list(handle.keys())
        return handle.get_tensor(keys[0]).dtype if keys else torch.float32
