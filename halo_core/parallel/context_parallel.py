"""Context parallelism, Ulysses style, through transformers' attention-function registry.

Each CP rank holds one contiguous chunk of every sequence. Inside attention an
all-to-all trades the chunk of all heads for all of the sequence on ``heads / cp`` heads,
the model's own attention implementation runs on the whole sequence, and a second
all-to-all trades back. The attention module itself is not rewritten: the model's
attention implementation is switched to ``halo_attention``, registered in
``ALL_ATTENTION_FUNCTIONS``, which wraps the implementation the model had. Under tensor
parallelism the same wrapper (with ``cp`` possibly 1) hands the inner implementation this
rank's part of per-head parameters such as GPT-OSS's sinks.

Inputs: ``context_parallel_inputs`` gives a CP rank its chunk with global position ids and
labels shifted before the split (no token loses its label at a chunk boundary), and the
loss is normalised by the whole sequence's token count, so the CP ranks' losses add up to
the sequence's. Packed documents (position ids restarting at 0) get a block-diagonal
causal mask over the whole sequence, so no token attends across a document boundary.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from halo_core.errors import LayoutError
from halo_core.hf_config import text_config
from halo_core.parallel.collectives import all_gather_single
from halo_core.parallel.dtensor import local
from halo_core.parallel.layout_state import register_shard, shard_of
from halo_core.parallel.local_heads import LocalHeads
from halo_core.parallel.ring_attention import ring_attention

IMPLEMENTATION = "halo_attention"


@dataclass
class ContextShard:
    group: Any
    size: int
    rank: int
    inner: Callable[..., Any]
    needs_mask: bool
    mode: str = "ulysses"


def _exchange(x: torch.Tensor, group) -> torch.Tensor:
    """All-to-all along dim 0 (split evenly over the group)."""
    return all_to_all_single_autograd(x.contiguous(), None, None, group)


def _gather_sequence(x: torch.Tensor, cp: int, group) -> torch.Tensor:
    """[B, H, S/cp, D] on each rank -> [B, H/cp, S, D] (this rank's heads, the whole sequence)."""
    b, h, s, d = x.shape
    x = x.reshape(b, cp, h // cp, s, d).permute(1, 0, 2, 3, 4)
    x = _exchange(x, group)  # dim 0 now indexes the sequence chunk (the source rank)
    return x.permute(1, 2, 0, 3, 4).reshape(b, h // cp, cp * s, d)


def _scatter_sequence(x: torch.Tensor, cp: int, group) -> torch.Tensor:
    """[B, S, H/cp, D] (attention output layout) -> [B, S/cp, H, D] (this rank's chunk, all heads)."""
    b, s, h, d = x.shape
    x = x.reshape(b, cp, s // cp, h, d).permute(1, 0, 2, 3, 4)
    x = _exchange(x, group)  # dim 0 now indexes the head chunk (the source rank)
    return x.permute(1, 2, 0, 3, 4).reshape(b, s // cp, cp * h, d)


def _causal_mask(module: nn.Module, length: int, dtype: torch.dtype, device, documents: torch.Tensor | None = None) -> torch.Tensor:
    """Additive causal (sliding-window) mask over the whole sequence; with ``documents`` [B, S], block-diagonal too."""
    position = torch.arange(length, device=device)
    allowed = position[None, :] <= position[:, None]
    window = getattr(module, "sliding_window", None)
    if window:
        allowed &= position[:, None] - position[None, :] < window
    allowed = allowed[None, None]
    if documents is not None:
        allowed = allowed & (documents[:, None, :, None] == documents[:, None, None, :])
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)


def sequence_documents(position_ids: torch.Tensor | None, group, size: int) -> torch.Tensor | None:
    """Document index of every token of the whole sequence [B, S], from the CP ranks' position-id chunks:
    a packed document starts where its position id is 0. ``None`` when every row is one document."""
    if position_ids is None:
        return None
    batch, length = position_ids.shape
    chunks = torch.empty((size * batch, length), dtype=position_ids.dtype, device=position_ids.device)
    all_gather_single(chunks, position_ids.contiguous(), group=group)
    positions = chunks.view(size, batch, length).permute(1, 0, 2).reshape(batch, size * length)
    starts = positions == 0
    if not starts[:, 1:].any():
        return None
    return torch.cumsum(starts.to(torch.int32), dim=1)


def _additive_mask(module: nn.Module, mask: torch.Tensor | None, query: torch.Tensor) -> torch.Tensor:
    """The float mask an eager implementation adds, from the boolean (or absent, meaning causal) mask
    transformers builds for ``halo_attention`` (its SDPA mask function is registered for it)."""
    if mask is None:
        return _causal_mask(module, query.shape[2], query.dtype, query.device)
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(~mask, torch.finfo(query.dtype).min)
    return mask


def sharded_attention(module: nn.Module, query, key, value, attention_mask, **kwargs):
    """The ``halo_attention`` attention implementation (same signature and result as transformers'):
    this TP rank's heads, then the CP exchange the shard asks for (none, Ulysses or ring)."""
    shard: ContextShard = shard_of(module)
    if kwargs.get("s_aux") is not None:  # per-head sinks handed to non-eager implementations
        kwargs["s_aux"] = local(kwargs["s_aux"])
    if shard.size == 1:
        return _local_heads(module, shard, query, key, value, attention_mask, **kwargs)
    if shard.mode == "ring":
        return _ring(module, shard, query, key, value, **kwargs)
    return _ulysses(module, shard, query, key, value, **kwargs)


def _local_heads(module, shard: ContextShard, query, key, value, attention_mask, **kwargs):
    """Tensor parallelism alone: the model's mask, this rank's heads, nothing to exchange."""
    if shard.needs_mask:
        attention_mask = _additive_mask(module, attention_mask, query)
    return shard.inner(LocalHeads(module, slice(None)), query, key, value, attention_mask, **kwargs)


def _ring(module, shard: ContextShard, query, key, value, **kwargs):
    sinks = kwargs.pop("s_aux", None)
    if sinks is None:
        sinks = LocalHeads(module, slice(None)).per_head.get("sinks")
    documents = sequence_documents(kwargs.get("position_ids"), shard.group, shard.size)
    if documents is not None:
        length = query.shape[2]
        documents = documents[:, shard.rank * length : (shard.rank + 1) * length].contiguous()
    return ring_attention(module, query, key, value, shard, sinks, documents, **kwargs)


def _ulysses(module, shard: ContextShard, query, key, value, **kwargs):
    documents = sequence_documents(kwargs.get("position_ids"), shard.group, shard.size)
    q, k, v = (_gather_sequence(t, shard.size, shard.group) for t in (query, key, value))
    needs_mask = shard.needs_mask or getattr(module, "sliding_window", None) or documents is not None
    mask = _causal_mask(module, q.shape[2], q.dtype, q.device, documents) if needs_mask else None
    heads = slice(shard.rank * q.shape[1], (shard.rank + 1) * q.shape[1])
    if kwargs.get("s_aux") is not None:
        kwargs["s_aux"] = kwargs["s_aux"][heads]
    output, _ = shard.inner(LocalHeads(module, heads), q, k, v, mask, **kwargs)
    return _scatter_sequence(output, shard.size, shard.group), None


ALL_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, sharded_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, sdpa_mask)


def _inner_attention(module: nn.Module, implementation: str):
    if implementation == "eager":
        eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if eager is None:
            raise LayoutError(f"{type(module).__module__} has no eager_attention_forward for context parallelism to wrap")
        return eager, True
    if implementation == IMPLEMENTATION:
        raise LayoutError("this attention module is already context-parallel; parallelize() a model only once")
    return ALL_ATTENTION_FUNCTIONS[implementation], False


def shard_attention(module: nn.Module, implementation: str, group, size: int, rank: int, mode: str = "ulysses") -> None:
    inner, needs_mask = _inner_attention(module, implementation)
    if mode == "ring":
        others = [n for n in LocalHeads(module, slice(None)).per_head if n != "sinks"]
        if others:
            raise LayoutError(f"{type(module).__name__} has per-head parameters {others} that ring attention does not know; use cp_attention='ulysses'")
    register_shard(module, ContextShard(group, size, rank, inner, needs_mask, mode))


def uses_context_parallel(module: nn.Module) -> bool:
    return shard_of(module, ContextShard) is not None


def check_heads(config, cp: int) -> None:
    """Ulysses scatters heads: both head counts must divide by ``cp``."""
    text = text_config(config)
    for field in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(text, field, None)
        if heads and heads % cp:
            raise LayoutError(f"{field}={heads} is not divisible by context parallel size cp={cp} (context_parallel_size); Ulysses attention scatters heads over the CP ranks, so choose cp among the divisors of both head counts")


def context_parallel_inputs(
    input_ids: torch.Tensor, cp_rank: int, cp: int, labels: torch.Tensor | None = None, ignore_index: int = -100,
    position_ids: torch.Tensor | None = None,
) -> dict:
    """One CP rank's share of a batch: its sequence chunk, global positions (or the given ``position_ids``
    of packed documents), labels shifted before the split.

    Pass the result to the model (``model(**inputs)``); the returned loss is this chunk's
    part of the whole sequence's mean, so the CP ranks' losses sum to it.
    """
    batch, length = input_ids.shape
    if length % cp:
        raise LayoutError(f"sequence length {length} is not divisible by context parallel size cp={cp}; pad or pack to a multiple of {cp}")
    labels = input_ids if labels is None else labels
    shift_labels = torch.cat([labels[:, 1:], labels.new_full((batch, 1), ignore_index)], dim=1)
    chunk = slice(cp_rank * length // cp, (cp_rank + 1) * length // cp)
    positions = torch.arange(length, device=input_ids.device).expand(batch, length) if position_ids is None else position_ids
    mine = shift_labels[:, chunk].contiguous()
    return {
        "input_ids": input_ids[:, chunk].contiguous(),
        "position_ids": positions[:, chunk].contiguous(),
        "labels": mine,
        "shift_labels": mine,
        "num_items_in_batch": int((shift_labels != ignore_index).sum()),
    }
