"""Reordering rows by a permutation, with backwards that gather instead of adding into zeros.

Autograd's indexing backward scatters with atomic adds into a zero-filled buffer, even where
the index is a permutation. Knowing the inverse, each backward here is a gather too, which a
compiled graph fuses with the pointwise work beside it (the routing weights, the sum over a
token's pairs) instead of writing and re-reading a buffer of every pair.
"""

from __future__ import annotations

import torch


def inverse_permutation(order: torch.Tensor) -> torch.Tensor:
    """``inverse[order[i]] = i``."""
    return torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))


class PermuteRows(torch.autograd.Function):
    """``rows[order]``, ``order`` a permutation whose inverse is given."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, order: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(inverse)
        return rows.index_select(0, order)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (inverse,) = ctx.saved_tensors
        return grad.index_select(0, inverse), None, None


class ExpandToPairs(torch.autograd.Function):
    """Row ``i``: the token of pair ``order[i]`` (pairs numbered token-major, ``top_k`` a token).

    The backward gathers each token's ``top_k`` pair gradients (by ``inverse``) and sums them,
    where autograd's ``index_select`` backward would add each row into its token with atomic
    adds (4.3 ms a step on the benchmark model's EP2, measured on the H200)."""

    @staticmethod
    def forward(ctx, hidden_states: torch.Tensor, order: torch.Tensor, inverse: torch.Tensor, top_k: int) -> torch.Tensor:
        ctx.save_for_backward(inverse)
        ctx.top_k = top_k
        return hidden_states.index_select(0, torch.div(order, top_k, rounding_mode="floor"))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (inverse,) = ctx.saved_tensors
        return grad.index_select(0, inverse).view(-1, ctx.top_k, grad.shape[-1]).sum(dim=1), None, None, None
