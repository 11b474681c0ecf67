"""Ring attention: context parallelism that keeps every head on every rank.

Each CP rank holds one contiguous chunk of the sequence with all heads. Keys and values
travel round the ring of CP ranks (point-to-point, one hop per step); each rank attends
its queries to every chunk at or before its own, block by block, merging the blocks with
an online softmax (running log-sum-exp), so no rank ever holds the whole sequence's keys
or a whole score matrix. The backward pass sends the keys and values round again with
their gradient accumulators, which arrive home after a full turn.

Used where Ulysses cannot go (head counts not divisible by ``cp``) or where a sequence is
too long for all heads on one rank. The block computation is plain PyTorch (float32
softmax statistics), so it runs wherever the model does; it supports what the catalogue's
attention needs: scaling, grouped key/value heads, causal and sliding-window masks, and
per-head sinks (GPT-OSS), and packed documents (their index travels with the keys). Dropout
and logit soft-capping are refused.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from halo_core.errors import LayoutError


def _rotate(tensors: list[torch.Tensor], group, rank: int, size: int) -> list[torch.Tensor]:
    """Send each tensor to the next rank of the ring and receive the previous rank's."""
    to = dist.get_global_rank(group, (rank + 1) % size)
    source = dist.get_global_rank(group, (rank - 1) % size)
    received = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in tensors]
    ops = []
    for tensor, buffer in zip(tensors, received):
        ops.append(dist.P2POp(dist.isend, tensor.contiguous(), to, group))
        ops.append(dist.P2POp(dist.irecv, buffer, source, group))
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return received


def _allowed(q_chunk: int, k_chunk: int, length: int, window: int | None, device, q_docs=None, k_docs=None) -> torch.Tensor | None:
    """Which (query, key) pairs of two chunks may attend, by global position and document; ``None`` = all."""
    if k_chunk < q_chunk and not window and q_docs is None:
        return None
    q = q_chunk * length + torch.arange(length, device=device)
    k = k_chunk * length + torch.arange(length, device=device)
    allowed = k[None, :] <= q[:, None]
    if window:
        allowed &= q[:, None] - k[None, :] < window
    if q_docs is not None:  # [B, 1, S, S]: packed documents never attend to each other
        allowed = allowed[None, None] & (q_docs[:, None, :, None] == k_docs[:, None, None, :])
    return allowed


def _scores(q, k, scale, allowed):
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    return scores if allowed is None else scores.masked_fill(~allowed, float("-inf"))


def _safe_exp(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isneginf(x), torch.zeros_like(x), torch.exp(x))


class RingAttention(torch.autograd.Function):
    """softmax(q k^T * scale + mask [+ sinks]) v over the whole sequence, with k/v passed round the ring.

    q, k: [B, H, S, D] and [B, Hkv, S, D]; v: [B, Hkv, S, Dv] (this rank's chunk); sinks: [H] or None;
    documents: [B, S] document index of this chunk's tokens (packed sequences) or None.
    Returns [B, H, S, Dv].
    """

    @staticmethod
    def forward(ctx, q, k, v, sinks, documents, scale, window, group, rank, size):
        groups = q.shape[1] // k.shape[1]
        length = q.shape[2]
        out = torch.zeros((*q.shape[:3], v.shape[-1]), dtype=torch.float32, device=q.device)
        lse = torch.full(q.shape[:3], float("-inf"), dtype=torch.float32, device=q.device)
        kv = [k, v] + ([documents] if documents is not None else [])
        for step in range(size):
            source = (rank - step) % size
            if source <= rank:
                allowed = _allowed(rank, source, length, window, q.device, documents, kv[2] if documents is not None else None)
                if allowed is None or allowed.any():
                    key, value = (t.repeat_interleave(groups, dim=1) for t in kv[:2])
                    scores = _scores(q, key, scale, allowed)
                    block_lse = torch.logsumexp(scores, dim=-1)
                    merged = torch.logaddexp(lse, block_lse)
                    block = torch.matmul(_safe_exp(scores - merged[..., None]).to(value.dtype), value).float()
                    out = out * _safe_exp(lse - merged)[..., None] + block
                    lse = merged
            if step < size - 1:
                kv = _rotate(kv, group, rank, size)
        if sinks is not None:  # one more logit per head, with no value: it only scales the output down
            total = torch.logaddexp(lse, sinks.float()[None, :, None])
            out = out * _safe_exp(lse - total)[..., None]
            lse = total
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, sinks, documents, out, lse)
        ctx.config = (scale, window, group, rank, size)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, sinks, documents, out, lse = ctx.saved_tensors
        scale, window, group, rank, size = ctx.config
        groups = q.shape[1] // k.shape[1]
        length = q.shape[2]
        delta = (grad_out.float() * out.float()).sum(-1)  # [B, H, S]
        grad_q = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        travelling = [k, v, torch.zeros(k.shape, dtype=torch.float32, device=k.device), torch.zeros(v.shape, dtype=torch.float32, device=v.device)]
        travelling += [documents] if documents is not None else []
        for step in range(size):
            source = (rank - step) % size
            key_chunk, value_chunk, grad_k, grad_v = travelling[:4]
            key_docs = travelling[4] if documents is not None else None
            allowed = _allowed(rank, source, length, window, q.device, documents, key_docs)
            if source <= rank and (allowed is None or allowed.any()):
                key, value = (t.repeat_interleave(groups, dim=1) for t in (key_chunk, value_chunk))
                probs = _safe_exp(_scores(q, key, scale, allowed) - lse[..., None])  # [B, H, S, S]
                grad_value = torch.matmul(probs.transpose(-1, -2), grad_out.float())
                grad_probs = torch.matmul(grad_out.float(), value.float().transpose(-1, -2))
                grad_scores = probs * (grad_probs - delta[..., None]) * scale
                grad_q += torch.matmul(grad_scores, key.float())
                grad_key = torch.matmul(grad_scores.transpose(-1, -2), q.float())
                fold = lambda g: g.unflatten(1, (k.shape[1], groups)).sum(2)  # noqa: E731 - repeated heads back to key/value heads
                grad_k = grad_k + fold(grad_key)
                grad_v = grad_v + fold(grad_value)
            travelling = _rotate([key_chunk, value_chunk, grad_k, grad_v] + ([key_docs] if documents is not None else []), group, rank, size)
        grad_k, grad_v = travelling[2], travelling[3]  # a full turn: this rank's own keys and values, every rank's gradient
        grad_sinks = None
        if sinks is not None:
            grad_sinks = -(_safe_exp(sinks.float()[None, :, None] - lse) * delta).sum(dim=(0, 2)).to(sinks.dtype)
        return grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype), grad_sinks, None, None, None, None, None, None


def ring_attention(module, query, key, value, shard, sinks, documents=None, **kwargs):
    """The ``ring`` CP attention: same inputs as transformers' attention functions, output [B, S, H, D]."""
    if kwargs.get("dropout"):
        raise LayoutError(f"{type(module).__name__}: ring attention has no dropout; set attention_dropout=0 or use Ulysses CP")
    if kwargs.get("softcap") or getattr(getattr(module, "config", None), "attn_logit_softcapping", None):
        raise LayoutError(f"{type(module).__name__}: ring attention has no logit soft-capping; use Ulysses CP")
    scale = kwargs.get("scaling") or getattr(module, "scaling", None) or query.shape[-1] ** -0.5
    window = kwargs.get("sliding_window") or getattr(module, "sliding_window", None)
    output = RingAttention.apply(query, key, value, sinks, documents, scale, window, shard.group, shard.rank, shard.size)
    return output.transpose(1, 2).contiguous(), None
