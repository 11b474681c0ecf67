"""What ``parallelize`` records on a model so that gradient sync, clipping and saving know its layout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch import nn

from halo_core.parallel.config import ParallelDims

_ATTRIBUTE = "_halo_layout"


@dataclass(frozen=True)
class ModelLayout:
    dims: ParallelDims
    mesh: Any
    #: Names (as in ``named_parameters``) of parameters sharded along the expert dimension.
    expert_params: frozenset[str]
    #: Whether FSDP2 shards the parameters (then gradients are reduced by its backward hooks).
    fsdp: bool = False

    def group(self, dim: str):
        """Process group of a mesh dimension; ``"dp"`` is every rank, ``"expert_replicas"`` the ranks holding the same experts."""
        if self.mesh is None:
            return None
        if dim == "dp":
            return dist.group.WORLD
        if dim == "expert_replicas":
            from halo_core.parallel.fsdp import expert_replica_mesh

            return expert_replica_mesh(self.mesh).get_group()
        return self.mesh.get_group(dim)

    @property
    def is_distributed(self) -> bool:
        return self.mesh is not None


def attach(model: nn.Module, layout: ModelLayout) -> None:
    object.__setattr__(model, _ATTRIBUTE, layout)


def layout_of(model: nn.Module) -> ModelLayout:
    layout = getattr(model, _ATTRIBUTE, None)
    if layout is None:
        raise RuntimeError("this model was not laid out by halo_core.parallelize(); call it first on every rank")
    return layout
