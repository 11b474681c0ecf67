"""Gradient averaging and global-norm clipping that reproduce a single process on the whole batch.

With FSDP2 its backward hooks do the sums (``fsdp``) and ``sync_gradients`` only divides;
without it, the sums are all-reduces.

After backward, a replicated parameter holds its rank's gradient and an expert shard holds
the sum over its EP x ETP group's ranks (the all-to-all's and the ETP gather's backward
bring every source rank's contribution home). Context-parallel ranks hold parts of one
sample whose losses add up; tensor-parallel ranks hold the same sample and the same
gradients (a TP shard's gradient is its part of the whole one). So: sum replicated
gradients over the data-parallel ranks, expert gradients over the ranks holding the same
experts (plus the ETP group for a bias every ETP rank holds whole), and divide all by the
data-parallel size; every parameter then holds the gradient of the mean over
data-parallel ranks of their samples' losses.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from halo_core.parallel.dtensor import local
from halo_core.parallel.layout_state import ModelLayout, layout_of
from halo_core.parallel.mesh import MESH_DIMS


def _all_reduce_sum(tensors: list[torch.Tensor], group) -> None:
    tensors = [local(t) for t in tensors]
    if not tensors:
        return
    flat = _flatten_dense_tensors(tensors)
    dist.all_reduce(flat, group=group)
    for tensor, reduced in zip(tensors, _unflatten_dense_tensors(flat, tensors)):
        tensor.copy_(reduced)


def _is_tp_shard(param: torch.Tensor) -> bool:
    """A DTensor split over ``tp`` (a row-wise layer's bias is a DTensor too, but replicated there)."""
    if not isinstance(param, DTensor):
        return False
    names = param.device_mesh.mesh_dim_names or ()
    return "tp" in names and param.placements[names.index("tp")].is_shard()


def _kinds(model: nn.Module, layout: ModelLayout):
    """(name, parameter, kind) for trainable parameters; kind is ``expert``, ``expert_whole`` or ``dense``."""
    for name, param in model.named_parameters():
        if param.requires_grad:
            kind = "expert_whole" if name in layout.etp_whole else "expert" if name in layout.expert_params else "dense"
            yield name, param, kind


def _sharded(name: str, layout: ModelLayout) -> bool:
    """Whether FSDP2 shards (and reduces) this parameter."""
    return layout.fsdp and name not in layout.outside_fsdp


def _duplicated_over(kind: str, param: torch.Tensor, layout: ModelLayout, sharded: bool) -> tuple[str, ...]:
    """Mesh dimensions along which ranks hold the same elements of this parameter's local tensor."""
    if kind == "dense":
        split = {"tp"} if _is_tp_shard(param) else set()
        if sharded:
            split |= {"ep_replica", "cp", "ep", "etp"}
    else:
        split = {"ep"} | ({"etp"} if kind == "expert" else set())
        if sharded:
            split |= {"ep_replica", "cp"}
    return tuple(d for d in MESH_DIMS if d not in split)


def replicated_dims(model: nn.Module) -> dict[str, tuple[str, ...]]:
    """Per trainable parameter: the mesh dimensions along which ranks must hold identical local tensors."""
    layout = layout_of(model)
    return {name: _duplicated_over(kind, param, layout, _sharded(name, layout)) for name, param, kind in _kinds(model, layout)}


@torch.no_grad()
def sync_gradients(model: nn.Module, *, divide: bool = True) -> float:
    """Average gradients over data-parallel ranks; call after backward, before clipping and the optimizer step.

    ``divide=False`` leaves the sums and returns the factor still owed (``1 / dp``; else 1.0), for
    ``clip_grad_norm_(..., owed=)`` to apply in its own multiply: one pass over every gradient fewer
    (2.6 ms a step on the benchmark model's EP2, measured on the H200).
    """
    layout = layout_of(model)
    if not layout.is_distributed:
        return 1.0
    params = list(_kinds(model, layout))
    if layout.tp_partial:  # parts computed from each TP rank's heads
        partial = [p for name, p, _ in params if name in layout.tp_partial]
        for param in partial:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        _all_reduce_sum([p.grad for p in partial], layout.group("tp"))
    unsharded = [(name, p, kind) for name, p, kind in params if not _sharded(name, layout)]
    if unsharded:
        for _, param, _ in unsharded:
            if param.grad is None:  # every rank must join the collective, used or not
                param.grad = torch.zeros_like(param)
        groups = {"dense": "dp", "expert": "expert_replicas", "expert_whole": "expert_whole"}
        for kind, group in groups.items():
            _all_reduce_sum([p.grad for _, p, k in unsharded if k == kind], layout.group(group))
    if layout.fsdp and layout.etp_whole:  # FSDP2 summed over the expert replicas; the ETP group's parts remain
        whole = [p for name, p, kind in params if kind == "expert_whole" and _sharded(name, layout)]
        for param in whole:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        _all_reduce_sum([p.grad for p in whole], layout.group("etp"))
    if not divide:
        return 1.0 / layout.dims.dp
    grads = [local(p.grad) for _, p, _ in params if p.grad is not None]
    if grads:  # one fused launch: a division per parameter cost the slower rank ~5 ms of host time a step (profiled)
        torch._foreach_div_(grads, layout.dims.dp)
    return 1.0


@torch.no_grad()
def global_grad_norm(model: nn.Module) -> torch.Tensor:
    """The 2-norm of the whole model's gradient, on every rank, left on the device (no host sync).

    Each element of the model counts once: a rank adds the squares of its local gradient
    only where it is the first of the ranks holding the same elements (first along every
    mesh dimension the parameter is replicated over), and the sum runs over the world.
    """
    layout = layout_of(model)
    coords = layout.coordinates()
    owned, device = [], None
    for name, param, kind in _kinds(model, layout):
        if param.grad is None:
            continue
        device = param.grad.device
        if not layout.is_distributed or all(coords[d] == 0 for d in _duplicated_over(kind, param, layout, _sharded(name, layout))):
            owned.append(local(param.grad))
    # Fused over the list: a norm and a square per parameter left the GPU idle while the host looped.
    norms = torch._foreach_norm(owned, 2.0, dtype=torch.float32) if owned else ()
    total_squares = torch.stack(norms).square().sum() if norms else torch.zeros((), device=device or "cpu")
    if layout.is_distributed:
        dist.all_reduce(total_squares)
    return torch.sqrt(total_squares)


def clip_factor(total_norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """What ``torch.nn.utils.clip_grad_norm_`` multiplies the gradients by."""
    return torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)


def clip_scale(model: nn.Module, max_norm: float, owed: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The global norm of gradients that still owe the factor ``owed`` (``sync_gradients(divide=False)``'s),
    and the one factor that pays it and clips them."""
    total = global_grad_norm(model) * owed
    return total, clip_factor(total, max_norm) * owed


@torch.no_grad()
def clip_grad_norm_(model: nn.Module, max_norm: float, norm_type: float = 2.0, *, owed: float = 1.0) -> torch.Tensor:
    """Clip like ``torch.nn.utils.clip_grad_norm_`` on the whole model; return the global norm on every rank.

    ``owed``: a factor the gradients still need (``sync_gradients(divide=False)``'s), applied in the same multiply.
    """
    if norm_type != 2.0:
        raise ValueError(f"clip_grad_norm_ supports norm_type=2.0 only, got {norm_type}")
    total, scale = clip_scale(model, max_norm, owed)
    if max_norm == float("inf") and owed == 1.0:
        return total
    grads = [local(p.grad) for p in model.parameters() if p.grad is not None]
    for dtype in {g.dtype for g in grads}:
        torch._foreach_mul_([g for g in grads if g.dtype == dtype], scale.to(dtype))
    return total

