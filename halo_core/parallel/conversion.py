"""Which checkpoint tensors make each of a model's weights, as transformers' own conversion mapping says.

transformers writes a checkpoint in its original layout (``save_pretrained`` reverts the mapping: Mixtral's
``block_sparse_moe``, one tensor per expert, Inkling 2's ``model.llm.``) and renames and converts the keys when it
loads. The sliced loader asks the same mapping, built for the laid-out model by transformers
(``get_model_conversion_mapping``, each part's transforms scoped to its prefix), which keys become each weight
(``sources``), and runs the mapping's own operations on what it read (``read``). Where every operation acts
expert by expert (stacking one tensor per expert, joining or transposing dims after the first), only this rank's
experts are read; any other operation gets the whole tensor and this rank's rows are taken after it.
"""

from __future__ import annotations

import contextlib
import copy
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn


@dataclass
class Source:
    """The checkpoint keys one or more weights come from, and the converter (``None``: a plain rename) joining them."""

    converter: object | None
    #: The converter's source pattern (a plain rename: the key itself) -> checkpoint keys, experts in order.
    keys: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    #: The weights it makes, the first the converter is named after.
    targets: tuple[str, ...] = ()


def sources(model: nn.Module, checkpoint_keys) -> dict[str, Source]:
    """Weight name -> its ``Source``, for every weight some checkpoint key becomes as transformers renames keys on load."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, dot_natural_key, rename_source_key

    with original_classes(model):
        transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    by_pattern = {pattern: converter for converter in converters for pattern in converter.source_patterns}
    wanted = dict.fromkeys(model.state_dict(), True)
    prefix = getattr(model, "base_model_prefix", None)
    found: dict[str, Source] = {}
    for key in sorted(checkpoint_keys, key=dot_natural_key):
        renamed, pattern = rename_source_key(key, renamings, converters, prefix, wanted)
        if renamed not in wanted and key in wanted:  # a key the model has as it is: only the prefix may differ
            renamed, pattern = rename_source_key(key, [], [], prefix, wanted)
        if renamed not in wanted:
            continue
        converter = by_pattern.get(pattern) if pattern is not None else None
        source = found.get(renamed)
        if source is None:
            targets = (renamed,) if converter is None else tuple(renamed.replace(converter.target_patterns[0], t) for t in converter.target_patterns)
            source = Source(converter, targets=targets)
            found.update(dict.fromkeys(targets, source))
        source.keys[pattern if converter is not None else key].append(key)
    return found


def _after_first(dim: int) -> bool:
    """A dim of an experts tensor ([E, ...], three dims) that is not the experts'."""
    return dim > 0 or dim in (-1, -2)


@contextlib.contextmanager
def original_classes(model: nn.Module):
    """transformers' own classes on the FSDP2 units while the mapping is built (for loading, or reverted by
    ``save_pretrained``): it looks transforms up by class name and skips a class it does not ship as custom code, so
    under FSDP2's ``FSDPInkling2ForCausalLM`` the root's mapping went scoped to the part below it and matched nothing."""
    from torch.distributed.fsdp import FSDPModule

    wrapped = [(m, type(m)) for m in model.modules() if isinstance(m, FSDPModule)]
    try:
        for module, cls in wrapped:
            module.__class__ = next(c for c in cls.__mro__[1:] if not issubclass(c, FSDPModule))
        yield
    finally:
        for module, cls in wrapped:
            module.__class__ = cls


#: Operations that act on each expert alone (they do not touch dim 0): run on this rank's experts only.
_PER_EXPERT = {"MergeModulelist": lambda op: op.dim == 0, "Concatenate": lambda op: _after_first(op.dim),
               "Interleave": lambda op: _after_first(op.dim), "Chunk": lambda op: _after_first(op.dim),
               "Transpose": lambda op: _after_first(op.dim0) and _after_first(op.dim1)}


def _per_expert(converter) -> bool:
    return all(_PER_EXPERT.get(type(op).__name__, lambda op: False)(op) for op in converter.operations)


class _Shapes:
    """The model as a converter's operations see it, but with each weight's shape as the read block has it (whole, or
    this rank's experts, before any ETP slice): ``Transpose(check_dims)`` compares against it, and under EP or FSDP2
    the live parameter's shape is neither."""

    def __init__(self, model: nn.Module, shapes: dict[str, tuple[int, ...]]):
        self._model, self._shapes = model, shapes

    def get_parameter(self, name: str) -> torch.Tensor:
        return torch.empty(self._shapes[name], device="meta")

    def __getattr__(self, name: str):
        return getattr(self._model, name)


def read(source: Source, read_key: Callable, model: nn.Module, rows: tuple[int, int] | None,
         shapes: dict[str, tuple[int, ...]]) -> tuple[dict[str, torch.Tensor], bool]:
    """The weights ``source`` makes, each its rows ``rows`` where they could be read alone, and whether they were.

    ``read_key(key, rows)`` reads a checkpoint tensor (``rows`` along dim 0, or whole); ``shapes``: each target's
    whole shape (before any ETP slice)."""
    if source.converter is None:
        (key,), = source.keys.values()
        return {source.targets[0]: read_key(key, rows)}, rows is not None
    converter = source.converter
    sliced = rows is not None and _per_expert(converter)
    if type(converter.operations[0]).__name__ == "MergeModulelist":  # one key per expert: all of them, in order
        experts = shapes[source.targets[0]][converter.operations[0].dim]
        for keys in source.keys.values():
            _check_every_expert(keys, experts, source.targets[0])
    stacks = sliced and type(converter.operations[0]).__name__ == "MergeModulelist"
    tensors = {}
    for pattern, keys in source.keys.items():
        if stacks:
            tensors[pattern] = [read_key(k, None) for k in keys[rows[0] : rows[1]]]
        else:
            tensors[pattern] = [read_key(k, rows if sliced else None) for k in keys]
    if sliced:
        shapes = {name: (rows[1] - rows[0], *shape[1:]) for name, shape in shapes.items()}
    return _convert(copy.deepcopy(converter), tensors, source.targets[0], _Shapes(model, shapes)), sliced


class MissingTensor(KeyError):
    """A checkpoint without one of the per-expert tensors a weight is stacked from."""


def _check_every_expert(keys: list[str], experts: int, name: str) -> None:
    """``keys`` (sorted as transformers sorts them, numbers by value) are one per expert; else the first missing key,
    by the one path segment where they differ (a shorter list would stack other experts into this rank's rows)."""
    if len(keys) == experts:
        return
    parts = [k.split(".") for k in keys]
    varying = [i for i in range(len(parts[0])) if len({p[i] for p in parts if len(p) == len(parts[0])}) > 1]
    found = [int(p[varying[0]]) for p in parts] if len(varying) == 1 and all(p[varying[0]].isdigit() for p in parts) else None
    if found is None:
        raise MissingTensor(f"one of the {experts} per-expert tensors of {name} (found {len(keys)}: {keys[:2]}...)")
    missing = min(set(range(experts)) - set(found), default=None)
    if missing is None:
        raise MissingTensor(f"one of the {experts} per-expert tensors of {name} (found {len(keys)}: {keys[:2]}...)")
    template = parts[0][:]
    template[varying[0]] = str(missing)
    raise MissingTensor(".".join(template))


def _convert(converter, tensors: dict[str, list[torch.Tensor]], first: str, model: _Shapes) -> dict[str, torch.Tensor]:
    """``WeightConverter.convert`` on tensors already read, named as transformers names its results."""
    for op in converter.operations:
        tensors = op.convert(tensors, source_patterns=converter.source_patterns, target_patterns=converter.target_patterns,
                             full_layer_name=first, model=model, config=model.config, missing_keys=None)
    name = first.replace("*.", "0.")
    prefix, _, suffix = next(name.partition(k) for k in tensors if k in name)
    return {prefix + k + suffix: (v[0] if isinstance(v, list) else v) for k, v in tensors.items()}
