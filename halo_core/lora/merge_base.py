"""The base an adapter names, as ``from_pretrained`` would load it, but built on the meta device and read tensor by tensor.

``halo export --merge`` must write what ``from_pretrained(base)`` + PEFT's ``merge_and_unload`` + ``save_pretrained``
write, without ever holding the whole base. Everything that decides that output but the weights' values comes from
transformers itself: the folder (a local one, or a hub id through transformers' own download and cache resolution),
the dtype (``dtype="auto"`` resolved as ``from_pretrained`` resolves it, ``_keep_in_fp32_modules`` included), the
class, config and generation config, and which weights are tied (and so not saved). The model is built on the meta
device (its buffers real, as Halo's loader builds it), so it costs nothing; the weights are read later, group by group
(``merge_stream``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from halo_core.errors import ConfigError


@dataclass
class Base:
    """The base on the meta device and where its weights are."""

    #: The folder holding the weights (a local folder, or the hub snapshot transformers resolved).
    folder: Path
    #: ``base_model_name_or_path`` as the adapter names it (a folder or a hub id).
    name: str
    model: nn.Module
    #: The dtype ``from_pretrained`` loads each state-dict entry in (``dtype``, or float32 where transformers keeps it so).
    dtypes: dict[str, torch.dtype]


def weights_folder(name: str) -> tuple[Path, list[str], dict | None]:
    """(folder, weight files, the index's ``metadata``) of a base: a local folder, or a hub id resolved by transformers
    (``cached_file``, ``get_checkpoint_shard_files``: the cache, downloading what is missing unless offline)."""
    from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

    path = Path(name)
    if path.is_dir():
        index = path / SAFE_WEIGHTS_INDEX_NAME
        if index.exists():
            files = sorted({str(path / f) for f in json.loads(index.read_text())["weight_map"].values()})
            return path, files, json.loads(index.read_text()).get("metadata", {})
        if (path / SAFE_WEIGHTS_NAME).exists():
            return path, [str(path / SAFE_WEIGHTS_NAME)], None
        raise ConfigError(f"the adapter's base {name} holds no {SAFE_WEIGHTS_NAME} or {SAFE_WEIGHTS_INDEX_NAME}; "
                          f"halo export --merge reads safetensors bases (re-save it with save_pretrained)")
    from transformers.utils.hub import cached_file, get_checkpoint_shard_files

    try:
        cached_file(name, "config.json")  # raises, naming why, where the id is malformed, unknown, or offline and not cached
        index = cached_file(name, SAFE_WEIGHTS_INDEX_NAME, _raise_exceptions_for_missing_entries=False)
        if index is not None:
            files, metadata = get_checkpoint_shard_files(name, index)
            return Path(index).parent, files, metadata
        single = cached_file(name, SAFE_WEIGHTS_NAME, _raise_exceptions_for_missing_entries=False)
    except (OSError, ValueError) as exc:  # not a folder, not a hub id, or not reachable (offline and not cached)
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"the adapter's base {name!r} (adapter_config.json: base_model_name_or_path) is neither a local folder nor "
                          f"a hub id transformers can resolve ({reason}); point base_model_name_or_path at the base's folder") from None
    if single is None:
        raise ConfigError(f"the adapter's base {name!r} has no {SAFE_WEIGHTS_NAME} or {SAFE_WEIGHTS_INDEX_NAME} on the hub; "
                          f"halo export --merge reads safetensors bases")
    return Path(single).parent, [single], None


def load(name: str, dtype, sequence_classification: bool) -> Base:
    """The base ``name`` as ``Auto*.from_pretrained(name, dtype=dtype)`` would build it (``dtype``: a torch dtype or
    ``"auto"``), on the meta device; nothing of its weights is read."""
    import transformers
    from accelerate import init_empty_weights
    from transformers.modeling_utils import _get_dtype

    folder, files, metadata = weights_folder(name)
    try:
        config = transformers.AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"the adapter's base {name!r} has no config transformers can read ({str(exc).strip().splitlines()[0]})") from None
    config, dtype = _get_dtype(dtype, files, config, metadata, None, True)  # from_pretrained's own resolution of "auto"
    auto = transformers.AutoModelForSequenceClassification if sequence_classification else transformers.AutoModelForCausalLM
    with init_empty_weights(include_buffers=False):
        model = auto.from_config(config, dtype=dtype)
    model.tie_weights()  # accelerate's meta init registers a new parameter where transformers ties one: tie them again
    if model.can_generate() and hasattr(model, "adjust_generation_fn"):  # the generation config from_pretrained reads
        model.adjust_generation_fn(None, True, False, name, cache_dir=None, force_download=False, proxies=None,
                                   local_files_only=False, token=None, revision=None, subfolder="", trust_remote_code=False)
    return Base(folder, name, model, _load_dtypes(model, dtype))


def _load_dtypes(model: nn.Module, dtype: torch.dtype) -> dict[str, torch.dtype]:
    """Each state-dict entry's dtype after ``from_pretrained``: its ``dtype_plan`` (``_keep_in_fp32_modules``) where a
    pattern matches, else the built parameter's own (a module may make one in float32 on purpose)."""
    from transformers.core_model_loading import build_glob_alternation

    plan = model._get_dtype_plan(dtype)
    alternation, by_group, _ = build_glob_alternation(list(plan)) if plan else (None, {}, {})
    dtypes = {}
    for name, tensor in model.state_dict().items():
        match = alternation.search(name) if alternation is not None else None
        dtypes[name] = plan[by_group[match.lastgroup]] if match is not None else tensor.dtype
    return dtypes


def saved_names(model: nn.Module) -> list[str]:
    """The state-dict entries ``save_pretrained`` writes: a weight tied to another (one parameter under two names,
    transformers' ``all_tied_weights_keys``) and ``_keys_to_ignore_on_save`` left out."""
    state = model.state_dict()
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    out = set(getattr(model, "_keys_to_ignore_on_save", None) or ())
    for target, source in tied.items():
        if target in state and source in state and _entry(model, target) is _entry(model, source):
            out.add(target)
    return [name for name in state if name not in out]


def _entry(model: nn.Module, name: str):
    module, _, leaf = name.rpartition(".")
    owner = model.get_submodule(module) if module else model
    return owner._parameters.get(leaf, owner._buffers.get(leaf))
