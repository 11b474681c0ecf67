"""Feeding CP x TP layouts for methods whose loss is a function of whole sequences (preference, reward, classification).

A sequence-level loss (a sigmoid of log-prob sums, a score read at the last token) cannot be split
into per-token parts that add up, as SFT's can. So the ranks of a CP x TP group pool their rows and
every rank of the group computes the whole pool's loss: TP ranks must (their collectives assume one
loss), and under CP each rank runs its chunk of every pooled sequence, after which the per-token
outputs of TRL's fused LM head are gathered over the CP group; the trainer's own loss then sees whole
sequences. The gather's backward keeps this rank's chunk only, so the CP ranks' gradients sum
(``sync_gradients``) to the gradient of the pool's loss, which is what one process computes on the pool.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from halo_core.parallel.collectives import all_gather_single
from halo_core.parallel.context_parallel import context_parallel_inputs
from halo_core.parallel.layout_state import layout_of

#: What a padded position of a pooled token tensor holds, by key (``*_input_ids`` pads with the pad token).
_FILL = {"labels": -100}
#: Per-token fields of TRL's fused-head output (``FusedCausalLMOutput``) gathered over the CP group.
_PER_TOKEN = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")


def _fill(key: str, pad_token_id: int) -> int:
    return pad_token_id if key.endswith("input_ids") else _FILL.get(key, 0)


def _gather_rows(tensor: torch.Tensor, counts: list[int], length: int | None, fill: int, group) -> torch.Tensor:
    """The group's tensors stacked along rows, each rank's padded to the longest rows and columns first."""
    shape = (max(counts), *tensor.shape[1:]) if length is None else (max(counts), length, *tensor.shape[2:])
    kind = torch.uint8 if tensor.dtype == torch.bool else tensor.dtype  # gloo gathers no bool
    padded = torch.full(shape, fill, dtype=kind, device=tensor.device)
    padded[tuple(slice(0, n) for n in tensor.shape)] = tensor
    pieces = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(pieces, padded, group=group)
    return torch.cat([p[:n] for p, n in zip(pieces, counts)]).to(tensor.dtype)


def pool_rows(inputs: dict, layout, pad_token_id: int, groups: int = 1) -> tuple[dict, torch.Tensor]:
    """The CP x TP group's batches joined, and this rank's rows in the joined one.

    ``groups``: how many blocks of examples the collator stacks along rows (TRL's preference
    collators put every chosen row first, then every rejected one: 2). A tensor whose row count
    is a multiple of the examples is pooled block by block, so the joined batch keeps that order;
    2-D token tensors are padded (right) to the group's longest. Non-tensors are kept as they are.
    """
    group = layout.group("sample")
    examples = inputs["input_ids"].shape[0] // groups
    device = inputs["input_ids"].device
    counts = torch.empty(dist.get_world_size(group), dtype=torch.int64, device=device)
    all_gather_single(counts, torch.tensor([examples], device=device), group=group)
    counts = counts.tolist()
    pooled = {}
    for key, value in inputs.items():
        if not isinstance(value, torch.Tensor) or value.dim() == 0 or examples == 0 or value.shape[0] % examples:
            pooled[key] = value
            continue
        length = None
        if value.dim() >= 2:
            longest = torch.tensor(value.shape[1], device=device)
            dist.all_reduce(longest, op=dist.ReduceOp.MAX, group=group)
            length = int(longest)
        blocks = value.split(examples)
        pooled[key] = torch.cat([_gather_rows(b, counts, length, _fill(key, pad_token_id), group) for b in blocks])
    me, total = dist.get_rank(group), sum(counts)
    start = sum(counts[:me])
    own = torch.cat([torch.arange(start, start + counts[me], device=device) + block * total for block in range(groups)])
    return pooled, own


class _GatherSequence(torch.autograd.Function):
    """All-gather along the sequence; every rank computes the same loss from the result, so the
    backward keeps this rank's own chunk of the gradient (no sum over ranks)."""

    @staticmethod
    def forward(ctx, chunk, group):
        ctx.rank, ctx.width = dist.get_rank(group), chunk.shape[1]
        pieces = [torch.empty_like(chunk) for _ in range(dist.get_world_size(group))]
        dist.all_gather(pieces, chunk.contiguous(), group=group)
        return torch.cat(pieces, dim=1)

    @staticmethod
    def backward(ctx, grad):
        return grad[:, ctx.rank * ctx.width : (ctx.rank + 1) * ctx.width], None


def _gather_sequence(chunk: torch.Tensor, group) -> torch.Tensor:
    if chunk.dtype == torch.bool:
        return _GatherSequence.apply(chunk.to(torch.uint8), group).bool()
    return _GatherSequence.apply(chunk, group)


def split_fused_head_over_cp(model, pad_token_id: int) -> None:
    """Under CP, make ``model(..., labels=, fused_lm_head=True)`` (TRL's fused LM head, as the
    preference trainers call it) run this rank's chunk of each sequence and return the whole
    sequences' per-token outputs; other calls (generation) are left as they are. Call after the
    trainer added its fused head. Padding must be on the right, as TRL's collators put it: causal
    attention then needs no mask.
    """
    layout = layout_of(model)
    cp = layout.dims.cp
    if cp == 1:
        return
    inner, group, rank = model.forward, layout.group("cp"), layout.coordinates()["cp"]

    @functools.wraps(inner)
    def forward(*args, fused_lm_head=False, **kwargs):
        if not fused_lm_head or args:
            return inner(*args, fused_lm_head=fused_lm_head, **kwargs)
        ids, labels = kwargs.pop("input_ids"), kwargs.pop("labels")
        kwargs.pop("attention_mask", None)
        length = ids.shape[1]
        pad = -length % cp
        if pad:
            ids = torch.cat([ids, ids.new_full((ids.shape[0], pad), pad_token_id)], dim=1)
            labels = torch.cat([labels, labels.new_full((labels.shape[0], pad), -100)], dim=1)
        split = context_parallel_inputs(ids, rank, cp, labels=labels)
        out = inner(input_ids=split["input_ids"], position_ids=split["position_ids"], shift_labels=split["shift_labels"],
                    fused_lm_head=True, **kwargs)
        for field in _PER_TOKEN:  # position t scores token t + 1, as the unsplit head's [:, :-1] does
            if getattr(out, field, None) is not None:
                setattr(out, field, _gather_sequence(getattr(out, field), group)[:, : length - 1])
        mask = labels[:, 1:length] != -100
        out.loss = -out.log_probs.sum() / mask.sum().clamp(min=1)
        return out

    model.forward = forward
