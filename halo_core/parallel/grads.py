"""Gradient averaging and global-norm clipping that reproduce a single process on the whole batch.

With FSDP2 its backward hooks do the sums (``fsdp``) and ``sync_gradients`` only divides;
without it, the sums are all-reduces.

After backward, a replicated parameter holds its rank's gradient and an expert shard holds
the sum over its EP group's ranks (the all-to-all's backward brings every source rank's
contribution home). Context-parallel ranks hold parts of one sample whose losses add up.
So: sum replicated gradients over every rank, sum expert gradients over the ranks holding
the same experts, and divide both by the data-parallel size; every parameter then holds
the gradient of the mean over data-parallel ranks of their samples' losses.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from halo_core.parallel.layout_state import layout_of


def _all_reduce_sum(tensors: list[torch.Tensor], group) -> None:
    if not tensors:
        return
    flat = _flatten_dense_tensors(tensors)
    dist.all_reduce(flat, group=group)
    for tensor, reduced in zip(tensors, _unflatten_dense_tensors(flat, tensors)):
        tensor.copy_(reduced)


def _split(model: nn.Module):
    layout = layout_of(model)
    expert, replicated = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (expert if name in layout.expert_params else replicated).append(param)
    return layout, expert, replicated


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP2 (DTensor) gradient; a plain tensor as it is."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


@torch.no_grad()
def sync_gradients(model: nn.Module) -> None:
    """Average gradients over data-parallel ranks; call after backward, before clipping and the optimizer step."""
    layout, expert, replicated = _split(model)
    if not layout.is_distributed:
        return
    if not layout.fsdp:
        for param in expert + replicated:
            if param.grad is None:  # every rank must join the collective, used or not
                param.grad = torch.zeros_like(param)
        _all_reduce_sum([p.grad for p in replicated], layout.group("dp"))
        if layout.dims.ep_replicas * layout.dims.cp > 1:
            _all_reduce_sum([p.grad for p in expert], layout.group("expert_replicas"))
    for param in expert + replicated:
        if param.grad is not None:
            param.grad.div_(layout.dims.dp)


@torch.no_grad()
def clip_grad_norm_(model: nn.Module, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """Clip like ``torch.nn.utils.clip_grad_norm_`` on the whole model; return the global norm on every rank.

    Replicated parameters count once, each expert shard once (summed over its EP group).
    Under FSDP2 every element lives on exactly one rank, so the squares of the local
    shards summed over the world give the whole model's.
    """
    if norm_type != 2.0:
        raise ValueError(f"clip_grad_norm_ supports norm_type=2.0 only, got {norm_type}")
    layout, expert, replicated = _split(model)
    grads_replicated = [_local(p.grad) for p in replicated if p.grad is not None]
    grads_expert = [_local(p.grad) for p in expert if p.grad is not None]
    device = (grads_replicated + grads_expert)[0].device if grads_replicated or grads_expert else torch.device("cpu")

    def squares(grads):
        return torch.stack([torch.linalg.vector_norm(g, 2.0, dtype=torch.float32) ** 2 for g in grads]).sum() if grads else torch.zeros((), device=device)

    if layout.fsdp:
        total_squares = squares(grads_replicated + grads_expert)
        dist.all_reduce(total_squares)
    else:
        expert_squares = squares(grads_expert)
        if layout.is_distributed and layout.dims.ep > 1:
            dist.all_reduce(expert_squares, group=layout.group("ep"))
        total_squares = squares(grads_replicated) + expert_squares
    total = torch.sqrt(total_squares)
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for grad in grads_replicated + grads_expert:
        grad.mul_(scale.to(grad.dtype))
    return total
