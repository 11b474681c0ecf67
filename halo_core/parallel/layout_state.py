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
    #: Expert parameters every ETP rank holds whole, each with part of the gradient (a down-projection bias).
    etp_whole: frozenset[str] = frozenset()
    #: Parameters kept whole under TP whose gradient each TP rank holds a part of (Qwen3's q/k norms).
    tp_partial: frozenset[str] = frozenset()

    def group(self, dim: str):
        """Process group of a mesh dimension, or of a named set of them:

        ``"dp"``: the ranks holding different data (all but ``tp``); ``"expert_replicas"``: the
        ranks holding the same experts; ``"expert_whole"``: those plus the ETP group (for expert
        parameters ETP keeps whole); ``"sample"``: the ranks sharing one sample (``cp`` x ``tp``).
        """
        if self.mesh is None:
            return None
        from halo_core.parallel.mesh import DATA_DIMS, flat_group

        named = {"dp": DATA_DIMS, "expert_replicas": ("ep_replicate", "cp"), "sample": ("cp", "tp"), "expert_whole": ("ep_replicate", "cp", "etp")}
        return flat_group(self.mesh, named[dim]) if dim in named else self.mesh.get_group(dim)

    def coordinates(self) -> dict[str, int]:
        """This rank's position on each axis (all zero in a single process)."""
        return self.dims.coordinates(dist.get_rank() if self.is_distributed else 0)

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
