"""Feeding context- and tensor-parallel layouts from a stock trainer's batches.

Each rank's dataloader yields its own samples, as without CP or TP. The ranks that share
samples (a CP x TP group) pool theirs, so the group trains ``cp * tp`` times the per-device
batch and the global batch is the same set of samples as at cp = tp = 1; they pad them to a
common length divisible by ``cp``, and each keeps its CP chunk of every sequence
(``context_parallel_inputs``; the whole sequence when cp = 1). Right padding is harmless
to causal attention and carries no labels, so the attention mask is dropped.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from halo_core.errors import ConfigError
from halo_core.parallel.context_parallel import context_parallel_inputs


def _gather_padded(tensor: torch.Tensor, length: int, fill: int, group) -> torch.Tensor:
    padded = torch.full((tensor.shape[0], length), fill, dtype=tensor.dtype, device=tensor.device)
    padded[:, : tensor.shape[1]] = tensor
    pieces = [torch.empty_like(padded) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, padded, group=group)
    return torch.cat(pieces, dim=0)


def split_for_shared_sample(inputs: dict, layout, pad_token_id: int) -> dict:
    """This rank's share of its CP x TP group's pooled batch; ``num_items_in_batch`` is left to the trainer."""
    if "position_ids" in inputs and "attention_mask" not in inputs:
        raise ConfigError("packing / padding-free batches are not supported with context_parallel_size or tensor_parallel_size > 1 yet; set packing: false")
    cp, group = layout.dims.cp, layout.group("sample")
    rank = layout.coordinates()["cp"]
    ids, labels = inputs["input_ids"], inputs.get("labels", inputs["input_ids"])
    longest = torch.tensor(ids.shape[1], device=ids.device)
    dist.all_reduce(longest, op=dist.ReduceOp.MAX, group=group)
    length = -(-int(longest) // cp) * cp
    pooled_ids = _gather_padded(ids, length, pad_token_id, group)
    pooled_labels = _gather_padded(labels, length, -100, group)
    split = context_parallel_inputs(pooled_ids, rank, cp, labels=pooled_labels)
    split.pop("num_items_in_batch")
    return split
