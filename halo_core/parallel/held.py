"""What part of each tensor this rank writes to a checkpoint: where it sits in the whole tensor, and its data.

Each part is written by exactly one rank:
- an FSDP2 (or tensor-parallel) DTensor sharded with ``Shard``/``Replicate`` placements: each rank its local
  shard (``compute_local_shape_and_global_offset``, DCP's own arithmetic);
- an expert parameter: its rank's block of experts (rows ``expert_rows``), its ETP slices joined within the ETP
  group first (one block, on the first ETP rank);
- of the ranks holding the same part (a replicated mesh dim, or the mesh dims outside the DTensor's own mesh: the
  TP ranks of an FSDP2 shard), the first along each such dim;
- a tensor every rank holds whole (buffers, ``shard_parameters: false``): one rank chosen so the bytes spread
  evenly (``owners``).
Anything else (a ``Partial``) is gathered whole onto one rank, one tensor at a time: ``gather_full``'s join, kept on
that rank only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from halo_core.parallel.layout_state import layout_of
from halo_core.parallel.mesh import MESH_DIMS
from halo_core.parallel.state_dict import _all_gather, gather_full


@dataclass(frozen=True)
class Part:
    """A block of a whole tensor: its offset along every dim, and the data (any device)."""

    offset: tuple[int, ...]
    tensor: torch.Tensor

    @property
    def rows(self) -> bool:
        """Whether the block is whole along every dim but the first (a block of rows, or the whole tensor)."""
        return all(o == 0 for o in self.offset[1:])


def _sharding(placement) -> bool:
    """A placement that cuts the tensor: ``Shard``, or FSDP2-over-TP's ``_StridedShard`` (a block of rows too, as
    ``compute_local_shape_and_global_offset`` computes it)."""
    return type(placement) in (Shard, _StridedShard)


def _plain_placements(tensor: DTensor) -> bool:
    return all(_sharding(p) or type(p) is Replicate for p in tensor.placements)


def chunked(model: nn.Module, name: str, tensor: torch.Tensor) -> bool:
    """Whether this rank's part of ``tensor`` is a block of it (else it is gathered whole); the same on every rank."""
    return not isinstance(tensor, DTensor) or _plain_placements(tensor)


def in_rows(model: nn.Module, name: str, tensor: torch.Tensor) -> bool:
    """Whether every rank's part of ``tensor`` is a block of rows (a per-expert conversion may run on it alone)."""
    if not isinstance(tensor, DTensor):
        return True
    return _plain_placements(tensor) and all(type(p) is Replicate or p.dim == 0 for p in tensor.placements)


def whole_shape(model: nn.Module, name: str, tensor: torch.Tensor) -> tuple[int, ...]:
    """The tensor's shape on one process (every expert, no ETP slice, no shard)."""
    from halo_core.parallel.loading import _whole_shape

    if name in layout_of(model).expert_params:
        return _whole_shape(model, name, tensor)
    return tuple(tensor.shape)


def owners(sizes: dict[str, int], world: int) -> dict[str, int]:
    """A rank for each tensor every rank holds whole, the bytes spread evenly (the same answer on every rank)."""
    load = [0] * world
    chosen = {}
    for name, size in sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])):
        rank = min(range(world), key=lambda r: (load[r], r))
        chosen[name] = rank
        load[rank] += size
    return chosen


def part(model: nn.Module, name: str, tensor: torch.Tensor, owner: int) -> Part | None:
    """This rank's part of ``name`` to write, or ``None`` (another rank writes it). ``owner``: the rank that writes a
    tensor held whole everywhere or gathered whole. Runs collectives (ETP joins, gathers): every rank calls it for
    every name, in the same order."""
    layout = layout_of(model)
    if not layout.is_distributed:
        return Part((0,) * tensor.dim(), tensor.detach())
    if not chunked(model, name, tensor):
        full = gather_full(model, [(name, tensor)], keep_on=owner).get(name)
        return Part((0,) * full.dim(), full) if full is not None else None
    expert = name in layout.expert_params
    sharded = {"ep"} if expert else set()  # mesh dims along which ranks hold different data of the tensor
    if isinstance(tensor, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # DCP's arithmetic (private)

        from halo_core.parallel.mesh import dims_of

        _, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
        if not all(isinstance(o, int) for o in offset):
            raise RuntimeError(f"{name}: its shards {tensor.placements} are not blocks of the tensor; Halo cannot write it in parts")
        for dim, placement in zip(tensor.device_mesh.mesh_dim_names, tensor.placements):
            if _sharding(placement):
                sharded.update(dims_of(dim))
        local, offset = tensor.to_local().detach(), list(offset)
    else:
        local, offset = tensor.detach(), [0] * tensor.dim()
    if expert or isinstance(tensor, DTensor):
        # one writer per distinct part: the first rank along every mesh dim holding copies of it (ETP ranks hold
        # slices, joined below onto the first)
        coordinates = layout.coordinates()
        writes = all(coordinates[d] == 0 for d in MESH_DIMS if d not in sharded)
    else:
        writes = dist.get_rank() == owner
    if expert:
        if layout.dims.etp > 1 and name not in layout.etp_whole:
            from halo_core.parallel.expert_tensor_parallel import join_slices

            split = layout.expert_shard(name).etp_splits[name.rsplit(".", 1)[1]]
            local = join_slices(_all_gather(local, layout.dims.etp, layout.group("etp")), split)
        offset[0] += layout.expert_rows(name)[0]
    return Part(tuple(offset), local) if writes and local.numel() else None
