"""The one DeviceMesh of a layout, built once; everything else asks it for groups by dimension name."""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from halo_core.parallel.config import ParallelDims


def build_mesh(dims: ParallelDims, device_type: str) -> DeviceMesh | None:
    """Mesh with dims ``("ep_replicate", "ep")``: ranks ``[k*ep, (k+1)*ep)`` form the k-th EP group.

    ``None`` in a single process. Only the EP split is laid out so far; TP, CP and ETP
    dimensions join this same mesh as their engines land.
    """
    if dims.world == 1:
        return None
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed must be initialised before parallelize() on more than one rank")
    return init_device_mesh(device_type, (dims.ep_replicas, dims.ep), mesh_dim_names=("ep_replicate", "ep"))
