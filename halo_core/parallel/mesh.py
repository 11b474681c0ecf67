"""The one DeviceMesh of a layout, built once; everything else asks it for groups by dimension name."""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from halo_core.parallel.config import ParallelDims


MESH_DIMS = ("ep_replicate", "cp", "ep")


def build_mesh(dims: ParallelDims, device_type: str) -> DeviceMesh | None:
    """Mesh with dims ``("ep_replicate", "cp", "ep")``, ``ep`` fastest (see ``ParallelDims.coordinates``).

    An EP group varies ``ep``; a CP group varies ``cp`` (the ranks sharing one sample);
    the ranks holding the same experts vary ``ep_replicate`` and ``cp``. ``None`` in a
    single process. TP and ETP dimensions join this mesh as their engines land.
    """
    if dims.world == 1:
        return None
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed must be initialised before parallelize() on more than one rank")
    return init_device_mesh(device_type, (dims.ep_replicas, dims.cp, dims.ep), mesh_dim_names=MESH_DIMS)
