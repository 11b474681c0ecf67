"""Tensor parallelism's view of an attention module: the per-head parameters of this rank's heads.

TP splits the heads, so a per-head parameter (GPT-OSS's sinks) is a DTensor whose local part
belongs to this rank's heads; Ulysses CP then takes a slice of those. The attention
implementations read such parameters off the module they are handed, so they get this view.
"""

from __future__ import annotations

from torch import nn

from halo_core.parallel.dtensor import local


class LocalHeads:
    """The attention module as ``heads`` of this rank's local heads see it; everything else is the module's."""

    def __init__(self, module: nn.Module, heads: slice) -> None:
        object.__setattr__(self, "_module", module)
        count = module.config.num_attention_heads
        per_head = {n: local(p)[heads] for n, p in module.named_parameters(recurse=False) if p.dim() == 1 and p.shape[0] == count}
        object.__setattr__(self, "per_head", per_head)

    def __getattr__(self, name: str):
        return self.per_head[name] if name in self.per_head else getattr(self._module, name)
