"""Expert-tensor parallelism: each expert's intermediate dimension split over ``etp`` ranks.

The ETP ranks hold different samples (ETP is carved out of the data-parallel ranks, like
EP). Before the experts run, an ETP group gathers its ranks' tokens and routing; each rank
computes every gathered token's output through its slice of the intermediate dimension
(gate/up column-wise, down row-wise, so the outputs are partial sums); the partial sums
are added over the group and each rank keeps its own tokens' rows. Backward is the
mirror image (a gather's gradient is a reduce-scatter and vice versa).

A per-expert bias of the down projection must be added once per group, not ``etp``
times: every rank keeps it whole, ranks other than the group's first take it back out,
and its gradient is summed over the ETP group (``partial_parameters``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from halo_core.errors import LayoutError
from halo_core.parallel.collectives import all_gather_single

#: How a fused parameter's intermediate axis is laid out: two concatenated halves
#: (gate then up), or one block (down, interleaved gate/up pairs, up only).
HALVES, BLOCK = "halves", "block"


@dataclass(frozen=True)
class IntermediateSplit:
    dim: int
    kind: str


def intermediate_splits(experts: nn.Module) -> tuple[dict[str, IntermediateSplit], list[str]]:
    """Which of the experts module's parameters are split on which axis, and which are kept whole.

    Read from the layout flags transformers' ``@use_experts_implementation`` declares.
    """
    transposed = experts.is_transposed
    gate_up_kind = HALVES if experts.has_gate and experts.is_concatenated else BLOCK
    known = {
        "gate_up_proj": IntermediateSplit(2 if transposed else 1, gate_up_kind),
        "gate_up_proj_bias": IntermediateSplit(1, gate_up_kind),
        "up_proj": IntermediateSplit(2 if transposed else 1, BLOCK),
        "up_proj_bias": IntermediateSplit(1, BLOCK),
        "down_proj": IntermediateSplit(1 if transposed else 2, BLOCK),
    }
    splits, whole = {}, []
    for name, _ in experts.named_parameters(recurse=False):
        if name in known:
            splits[name] = known[name]
        elif name == "down_proj_bias":
            whole.append(name)
        else:
            raise LayoutError(
                f"{type(experts).__name__}.{name}: the core does not know how to split it for expert-tensor "
                f"parallelism; implement wrap_moe_block in the family plugin or set etp=1"
            )
    return splits, whole


def take_slice(tensor: torch.Tensor, split: IntermediateSplit, rank: int, size: int) -> torch.Tensor:
    """This ETP rank's part of a full (EP-local) parameter."""
    if split.kind == HALVES:
        gate, up = tensor.chunk(2, dim=split.dim)
        return torch.cat([gate.chunk(size, dim=split.dim)[rank], up.chunk(size, dim=split.dim)[rank]], dim=split.dim)
    return tensor.chunk(size, dim=split.dim)[rank]


def join_slices(pieces: list[torch.Tensor], split: IntermediateSplit) -> torch.Tensor:
    """Inverse of ``take_slice`` over all ranks' pieces, in rank order."""
    if split.kind == HALVES:
        halves = [p.chunk(2, dim=split.dim) for p in pieces]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=split.dim)
    return torch.cat(pieces, dim=split.dim)


def intermediate_widths(experts: nn.Module) -> dict[str, int]:
    """Per split parameter, the intermediate width ETP divides (one half of a concatenated gate/up)."""
    splits, _ = intermediate_splits(experts)
    return {name: getattr(experts, name).shape[split.dim] // (2 if split.kind == HALVES else 1) for name, split in splits.items()}


def gather_rows(x: torch.Tensor, counts: list[int], group) -> torch.Tensor:
    most = max(counts)
    padded = x.new_zeros((most, *x.shape[1:]))
    padded[: x.shape[0]] = x
    out = x.new_empty((len(counts) * most, *x.shape[1:]))
    all_gather_single(out, padded.contiguous(), group=group)
    return torch.cat([out[i * most : i * most + c] for i, c in enumerate(counts)])


def _own_rows(x: torch.Tensor, counts: list[int], rank: int) -> torch.Tensor:
    start = sum(counts[:rank])
    return x[start : start + counts[rank]]


class GatherRows(torch.autograd.Function):
    """Concatenate every group rank's rows (in rank order); the gradient of a rank's rows is summed over the group."""

    @staticmethod
    def forward(ctx, x, counts, rank, group):
        ctx.counts, ctx.rank, ctx.group = counts, rank, group
        return gather_rows(x, counts, group)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return _own_rows(grad, ctx.counts, ctx.rank), None, None, None


class ReduceScatterRows(torch.autograd.Function):
    """Sum the group's tensors of gathered rows and keep this rank's rows (an all-reduce: gloo has no reduce-scatter)."""

    @staticmethod
    def forward(ctx, x, counts, rank, group):
        ctx.counts, ctx.group = counts, group
        total = x.contiguous().clone()
        dist.all_reduce(total, group=group)
        return _own_rows(total, counts, rank).clone()

    @staticmethod
    def backward(ctx, grad):
        return gather_rows(grad.contiguous(), ctx.counts, ctx.group), None, None, None


def row_counts(rows: int, group, device) -> list[int]:
    count = torch.tensor([rows], dtype=torch.int64, device=device)
    counts = torch.empty(dist.get_world_size(group), dtype=torch.int64, device=device)
    all_gather_single(counts, count, group=group)
    return counts.tolist()
