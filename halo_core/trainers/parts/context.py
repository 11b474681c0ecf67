"""Feeding context- and tensor-parallel layouts from a stock trainer's batches.

Each rank's dataloader yields its own samples, as without CP or TP. The ranks that share
samples (a CP x TP group) pool theirs, so the group trains ``cp * tp`` times the per-device
batch and the global batch is the same set of samples as at cp = tp = 1; they pad them to a
common length divisible by ``cp``, and each keeps its CP chunk of every sequence
(``context_parallel_inputs``; the whole sequence when cp = 1). Right padding is harmless
to causal attention and carries no labels, so the attention mask is dropped. Packed
(padding-free) batches are joined into one row of documents instead.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from halo_core.errors import ConfigError
from halo_core.parallel.collectives import all_gather_single
from halo_core.parallel.context_parallel import context_parallel_inputs


def _gather_padded(tensor: torch.Tensor, length: int, fill: int, group) -> torch.Tensor:
    padded = torch.full((tensor.shape[0], length), fill, dtype=tensor.dtype, device=tensor.device)
    padded[:, : tensor.shape[1]] = tensor
    pieces = [torch.empty_like(padded) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, padded, group=group)
    return torch.cat(pieces, dim=0)


def _pool_packed(inputs: dict, cp: int, group, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The group's packed rows ([1, L] each, documents marked by position ids restarting at 0) joined
    into one row, then a padding document up to a multiple of ``cp``."""
    ids, labels, positions = inputs["input_ids"], inputs.get("labels", inputs["input_ids"]), inputs["position_ids"]
    if ids.shape[0] != 1:
        raise ConfigError(f"a padding-free batch should be one row of packed documents, got {ids.shape[0]} rows")
    lengths = torch.empty(dist.get_world_size(group), dtype=torch.int64, device=ids.device)
    all_gather_single(lengths, torch.tensor([ids.shape[1]], device=ids.device), group=group)
    lengths = lengths.tolist()
    pieces = [_gather_padded(t, max(lengths), fill, group) for t, fill in ((ids, pad_token_id), (labels, -100), (positions, 0))]
    joined = [torch.cat([p[r : r + 1, :n] for r, n in enumerate(lengths)], dim=1) for p in pieces]
    pad = -sum(lengths) % cp
    if pad:
        filler = (torch.full((1, pad), fill, dtype=t.dtype, device=t.device) for t, fill in zip(joined, (pad_token_id, -100)))
        joined = [torch.cat([t, f], dim=1) for t, f in zip(joined[:2], filler)] + [torch.cat([joined[2], torch.arange(pad, device=ids.device)[None]], dim=1)]
    return joined[0], joined[1], joined[2]


def split_for_shared_sample(inputs: dict, layout, pad_token_id: int) -> dict:
    """This rank's share of its CP x TP group's pooled batch; ``num_items_in_batch`` is left to the trainer.

    Padded batches are pooled row by row; packed (padding-free) ones are joined into one row
    whose documents the attention keeps apart (``context_parallel``).
    """
    cp, group = layout.dims.cp, layout.group("sample")
    rank = layout.coordinates()["cp"]
    if "position_ids" in inputs and "attention_mask" not in inputs:
        ids, labels, positions = _pool_packed(inputs, cp, group, pad_token_id)
        split = context_parallel_inputs(ids, rank, cp, labels=labels, position_ids=positions)
    else:
        ids, labels = inputs["input_ids"], inputs.get("labels", inputs["input_ids"])
        longest = torch.tensor(ids.shape[1], device=ids.device)
        dist.all_reduce(longest, op=dist.ReduceOp.MAX, group=group)
        length = -(-int(longest) // cp) * cp
        split = context_parallel_inputs(_gather_padded(ids, length, pad_token_id, group), rank, cp, labels=_gather_padded(labels, length, -100, group))
    split.pop("num_items_in_batch")
    return split
