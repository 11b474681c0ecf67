"""What every layout hook receives: the degrees, the process groups and the model's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from halo_core.family import Family


@dataclass(frozen=True)
class ParallelContext:
    """The parallel layout one rank is adapting a model to.

    Degrees are resolved and validated before a context is built; ``mesh`` is a
    torch ``DeviceMesh`` with named dimensions when running distributed and ``None``
    in a single process.
    """

    family: Family
    model_type: str
    model_config: Any
    dp: int = 1
    ep: int = 1
    etp: int = 1
    tp: int = 1
    cp: int = 1
    mesh: Any = None
    #: The expert token dispatcher instance (``halo_core.parallel.dispatch``), when ``ep > 1``.
    ep_dispatcher: Any = None
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
