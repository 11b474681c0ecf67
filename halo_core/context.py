"""What every layout hook receives: the degrees, the process groups and the model's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from halo_core.family import Family

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from transformers import PretrainedConfig

    from halo_core.parallel.dispatch import TokenDispatcher


@dataclass(frozen=True)
class ParallelContext:
    """The parallel layout one rank is adapting a model to.

    Degrees are resolved and validated before a context is built, so a hook never sees
    a layout the family or the model cannot take.
    """

    #: The plugin's own declaration.
    family: Family
    #: The model's ``config.model_type``.
    model_type: str
    #: The model's transformers config.
    model_config: PretrainedConfig
    #: Data-parallel degree: the ranks FSDP2 shards over (1 = not split).
    dp: int = 1
    #: Expert-parallel degree: the ranks a MoE block's experts are divided among.
    ep: int = 1
    #: Expert-tensor-parallel degree: the ranks each expert's intermediate dimension is sliced over.
    etp: int = 1
    #: Tensor-parallel degree: the ranks attention heads and dense projections are split over.
    tp: int = 1
    #: Context-parallel degree: the ranks a sequence is split over.
    cp: int = 1
    #: torch ``DeviceMesh`` with the dimensions ``halo_core.parallel.mesh.MESH_DIMS`` when distributed; ``None`` in one process.
    mesh: DeviceMesh | None = None
    #: The expert token dispatcher instance (``halo_core.parallel.dispatch``), when ``ep > 1``.
    ep_dispatcher: TokenDispatcher | None = None
    #: ``"ulysses"`` or ``"ring"`` (``ParallelConfig.cp_attention``).
    cp_attention: str = "ulysses"

    def local_rank(self, dim: str) -> int:
        """This rank's coordinate along a mesh dimension (0 in a single process)."""
        return self.mesh.get_local_rank(dim) if self.mesh is not None else 0

    def degree(self, split: str) -> int:
        """Degree of a split by its name (``"ep"``, ``"cp"``, ``"tp"``, ``"etp"``)."""
        return getattr(self, split)

    @property
    def active_splits(self) -> frozenset[str]:
        """The splits with a degree above one."""
        return frozenset(s for s in ("ep", "cp", "tp", "etp") if self.degree(s) > 1)
