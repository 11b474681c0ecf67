"""The complete state dict (and gradients) under the model's original Hugging Face names and shapes, on rank 0."""

from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from halo_core.parallel.expert_tensor_parallel import join_slices
from halo_core.parallel.layout_state import layout_of


def _all_gather(tensor: torch.Tensor, size: int, group) -> list[torch.Tensor]:
    pieces = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(pieces, tensor.contiguous(), group=group)
    return pieces


@torch.no_grad()
def gather_full(model: nn.Module, named: Iterable[tuple[str, torch.Tensor]], device: torch.device | str | None = None,
                keep_on: int = 0) -> dict[str, torch.Tensor]:
    """Each tensor, sharded like the parameter of its name, joined whole on rank ``keep_on`` (other ranks: an empty dict).

    Weights, gradients and per-parameter optimizer state share this join, so all three are
    stored under the same names and shapes. Every rank must pass the same names in the same order.
    ``device``: where rank 0 keeps the joined tensors (``"cpu"`` keeps a whole state off the GPU).
    """
    layout = layout_of(model)
    rank = dist.get_rank() if layout.is_distributed else 0
    full: dict[str, torch.Tensor] = {}
    for name, tensor in named:
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()
        if layout.is_distributed and name in layout.expert_params:
            if layout.dims.etp > 1 and name not in layout.etp_whole:
                split = layout.expert_shard(name).etp_splits[name.rsplit(".", 1)[1]]
                tensor = join_slices(_all_gather(tensor, layout.dims.etp, layout.group("etp")), split)
            if layout.dims.ep > 1:
                tensor = torch.cat(_all_gather(tensor, layout.dims.ep, layout.group("ep")), dim=0)
        if rank == keep_on:
            full[name] = tensor.detach().to(device or tensor.device, copy=True)
    return full


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Expert shards gathered from their EP (and ETP) group; rank 0 gets everything, other ranks an empty dict.

    Every rank must call it (it runs collectives).
    """
    return gather_full(model, model.state_dict().items())


def full_gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    """Like :func:`full_state_dict` for the gradients (a zero tensor where a parameter has none)."""
    return gather_full(model, ((n, p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()))
