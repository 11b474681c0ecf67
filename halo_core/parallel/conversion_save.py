"""What transformers' ``save_pretrained`` writes for a model's tensors, group by group, so each rank can write its part.

``save_pretrained`` reverts the model type's conversion mapping on the whole state dict
(``revert_weight_conversion``: Qwen3-MoE's fused ``gate_up_proj`` back to one ``gate_proj`` and ``up_proj`` per
expert, Mixtral's ``block_sparse_moe``, ...). A rank holds only some experts of each fused tensor, so the mapping is
reverted here one group of tensors at a time (the tensors one reversed transform takes together), and where every
reversed operation acts expert by expert, on a rank's block of experts alone: its outputs are the block's rows of
the saved tensors, or, where the mapping splits the experts into one tensor each, those experts' tensors
(renumbered from the block's first expert). The groups are formed as ``revert_weight_conversion`` forms them; the
two ways transformers has done that since 5.17 are the one seam below (``_group_key``), and
``tests/test_checkpoint_conversion.py`` holds every bundled type's save to transformers' own file.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

import torch
from torch import nn

from halo_core.parallel.conversion import _PER_EXPERT, _Shapes, original_classes

#: Reversed operations that act on each expert alone (dim 0 untouched, or split into one tensor per expert).
_REVERSED_PER_EXPERT = {**_PER_EXPERT, "SplitModulelist": lambda op: op.dim == 0}


@dataclass
class SavedGroup:
    """Model tensors one reversed transform writes together, and how."""

    #: (model state-dict name, the reversed converter's source pattern it fills) in transformers' order.
    sources: list[tuple[str, str]] = field(default_factory=list)
    #: A reversed ``WeightConverter`` (copied for each use), or ``None``: a plain rename to ``first``.
    converter: object | None = None
    #: The name transformers converts the group under (the first target with its ``*``), or the saved key of a rename.
    first: str = ""
    #: Renamings transformers applies to a converter's outputs after converting (transformers >= 5.2x).
    after: list = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.sources]

    @property
    def per_expert(self) -> bool:
        """Whether the reversed operations act expert by expert: a block of experts converts alone."""
        return self.converter is None or all(_REVERSED_PER_EXPERT.get(type(op).__name__, lambda op: False)(op) for op in self.converter.operations)

    @property
    def splits_experts(self) -> bool:
        """Whether the outputs are one tensor per row of dim 0 (``SplitModulelist``): renumbered by the block's offset."""
        return self.converter is not None and any(type(op).__name__ == "SplitModulelist" for op in self.converter.operations)


def _reversed_transforms(model: nn.Module):
    """The reversed renamings and converters, as ``revert_weight_conversion`` builds them for a model built from its
    config (Halo's models are: no ``_weight_conversions``, so no ``PrefixChange``)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import PrefixChange, WeightConverter, WeightRenaming

    conversions = getattr(model, "_weight_conversions", None)
    if conversions is None:
        with original_classes(model):
            conversions = [c for c in get_model_conversion_mapping(model, add_legacy=False) if not isinstance(c, PrefixChange)]
    reversed_ = [c.reverse_transform() for c in (conversions or [])[::-1]]
    return [t for t in reversed_ if isinstance(t, WeightRenaming)], [t for t in reversed_ if isinstance(t, WeightConverter)]


def _group_key(key: str, renamings: list, converters: list) -> tuple[str, str | None, list]:
    """(the group's name, the converter pattern that matched or ``None``, renamings still to apply to its outputs)."""
    from transformers import core_model_loading as core

    if hasattr(core, "apply_converters"):  # transformers >= 5.2x: converters first, renamings on their outputs
        renamed, pattern = core.apply_converters(key, converters)
        if pattern is None:
            return core.apply_renamings(key, renamings), None, []
        return renamed, pattern, renamings
    renamed, pattern = core.rename_source_key(key, renamings, converters, reverse=True)  # transformers 5.17
    return renamed, pattern, []


def saved_groups(model: nn.Module, names: list[str]) -> list[SavedGroup]:
    """The groups ``revert_weight_conversion`` would form of ``names`` (model state-dict names), in its order."""
    from transformers.core_model_loading import dot_natural_key

    renamings, converters = _reversed_transforms(model)
    by_pattern = {pattern: converter for converter in converters for pattern in converter.source_patterns}
    groups: dict[str, SavedGroup] = {}
    for name in sorted(names, key=dot_natural_key):
        renamed, pattern, after = _group_key(name, renamings, converters)
        group = groups.get(renamed)
        if group is None:
            group = groups[renamed] = SavedGroup(converter=by_pattern[pattern] if pattern is not None else None, first=renamed, after=after)
        group.sources.append((name, pattern if pattern is not None else name))
    return list(groups.values())


def revert(group: SavedGroup, tensors: dict[str, torch.Tensor], model: nn.Module, first_row: int = 0) -> dict[str, torch.Tensor]:
    """The saved tensors ``group`` makes of ``tensors`` (its sources whole, or, for a per-expert group, the same
    block of rows of each, starting at row ``first_row``): saved key -> tensor."""
    if group.converter is None:
        (name, _), = group.sources
        return {group.first: tensors[name]}
    converter = copy.deepcopy(group.converter)
    for name, pattern in group.sources:
        converter.add_tensor(group.first, name, pattern, tensors[name])
    shapes = {name: tuple(tensor.shape) for name, tensor in tensors.items()}
    out = converter.convert(group.first, model=_Shapes(model, shapes), config=model.config)
    out = {key: value[0] if isinstance(value, list) else value for key, value in out.items()}
    if first_row and group.splits_experts:
        out = {_renumbered(key, group.converter.target_patterns, first_row): value for key, value in out.items()}
    if not group.after:
        return out
    from transformers.core_model_loading import apply_renamings

    return {apply_renamings(key, group.after): value for key, value in out.items()}


def _renumbered(key: str, patterns: list[str], offset: int) -> str:
    """``key``, one of the per-expert tensors ``SplitModulelist`` named from 0 for a block, named by its expert."""
    for pattern in patterns:
        if "*" not in pattern:
            continue
        match = re.search(re.escape(pattern).replace(r"\*", r"(\d+)"), key)
        if match:
            return key[: match.start(1)] + str(int(match.group(1)) + offset) + key[match.end(1) :]
    raise ValueError(f"{key}: none of {patterns} names its expert")


def saved_layout(model: nn.Module, groups: list[SavedGroup], shapes: dict[str, tuple[int, ...]], dtypes: dict[str, torch.dtype]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Every saved key's whole shape and dtype, in transformers' order: the groups reverted on the meta device."""
    layout = {}
    for group in groups:
        metas = {name: torch.empty(shapes[name], dtype=dtypes[name], device="meta") for name in group.names}
        for key, tensor in revert(group, metas, model).items():
            layout[key] = (tuple(tensor.shape), tensor.dtype)
    return layout
