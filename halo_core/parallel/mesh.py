"""The one DeviceMesh of a layout, built once; everything else asks it for groups by dimension name."""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from halo_core.parallel.config import ParallelDims


MESH_DIMS = ("ep_replica", "cp", "ep", "etp", "tp")
#: The dimensions whose ranks hold different samples (or, for ``cp``, different parts of one).
DATA_DIMS = ("ep_replica", "cp", "ep", "etp")
#: What their flattened mesh is called: FSDP2 shards over it, and the ecosystem (PEFT's adapter shapes, say)
#: reads a DTensor on an ``fsdp`` dimension as whole for compute, on any other as a tensor-parallel shard.
FSDP_DIM = "fsdp"


def flat_name(names: tuple[str, ...]) -> str:
    return FSDP_DIM if tuple(names) == DATA_DIMS else "_".join(names)


def dims_of(flat: str) -> tuple[str, ...]:
    """The mesh dimensions a (flattened) mesh dimension's name stands for: ``fsdp`` -> ``DATA_DIMS``,
    ``ep_replica_cp`` -> (``ep_replica``, ``cp``), ``tp`` -> (``tp``,)."""
    if flat == FSDP_DIM:
        return DATA_DIMS
    dims, rest = [], flat
    while rest:
        dim = next(d for d in sorted(MESH_DIMS, key=len, reverse=True) if rest == d or rest.startswith(d + "_"))
        dims.append(dim)
        rest = rest[len(dim) + 1 :]
    return tuple(dims)


def build_mesh(dims: ParallelDims, device_type: str) -> DeviceMesh | None:
    """Mesh with dims ``MESH_DIMS``, ``tp`` fastest (see ``ParallelDims.coordinates``).

    An EP group varies ``ep``, an ETP group ``etp`` (the two together share the experts),
    a CP group ``cp`` (the ranks sharing one sample's sequence), a TP group ``tp`` (the
    ranks sharing one sample's heads and MLP columns). ``None`` in a single process.
    """
    if dims.world == 1:
        return None
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed must be initialised before parallelize() on more than one rank")
    shape = (dims.ep_replicas, dims.cp, dims.ep, dims.etp, dims.tp)
    return init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIMS)


def flat_group(mesh: DeviceMesh, names: tuple[str, ...]):
    """Process group of the ranks that differ only along ``names`` (flattened sub-mesh)."""
    sub = mesh[names] if len(names) > 1 else mesh[names[0]]
    return (sub._flatten(flat_name(names)) if len(names) > 1 else sub).get_group()
