"""The expert dispatch's variable-size all-to-all, as PyTorch custom operators.

NCCL needs an all-to-all's split sizes on the host, and in an expert dispatch they are
data: the router's choices, counted on the device. Read back inside traced code, they break
a compiled layer's graph (dynamo resumes in every frame of the stack, so one read-back cost a
layer a dozen graph pieces and their Python) or need unbacked-size tracing, which inductor on
torch 2.11 rejected. As opaque operators with shape functions the read-back happens inside
``exchange_counts``, the trace sees one data-dependent size (the rows received) and the layer
stays one graph, forward and backward.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torch.distributed.distributed_c10d import _resolve_process_group
from torch.utils.checkpoint import CheckpointPolicy


@torch.library.custom_op("halo::exchange_counts", mutates_args=())
def exchange_counts(counts: torch.Tensor, group_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Exchange per-rank counts (``[ep, ...]``, row ``r`` for rank ``r``); return the counts each rank
    sent here (same shape) and the split sizes on the host: row 0 the rows this rank sends to each
    rank, row 1 the rows it receives from each (the one host read-back of a dispatch)."""
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts.contiguous(), group=_resolve_process_group(group_name))
    sizes = torch.stack([counts.reshape(counts.shape[0], -1).sum(1), received.reshape(received.shape[0], -1).sum(1)])
    return received, sizes.cpu()


@exchange_counts.register_fake
def _(counts, group_name):
    return torch.empty_like(counts), torch.empty((2, counts.shape[0]), dtype=torch.int64, device="cpu")


def _all_to_all(rows: torch.Tensor, send: list[int], receive: list[int], group_name: str, total: int | None = None) -> torch.Tensor:
    """Received rows first, then (up to ``total``) zero rows, written in place: no second buffer."""
    out = rows.new_empty((total if total is not None else sum(receive), *rows.shape[1:]))
    dist.all_to_all_single(out[: sum(receive)], rows[: sum(send)].contiguous(), receive, send, group=_resolve_process_group(group_name))
    out[sum(receive) :].zero_()
    return out


@torch.library.custom_op("halo::send_rows", mutates_args=())
def send_rows(rows: torch.Tensor, sizes: torch.Tensor, group_name: str, like: torch.Tensor | None = None) -> torch.Tensor:
    """Send the leading rows to the ranks by ``sizes[0]`` (rows past them go nowhere); return the rows
    received, ``sizes[1]`` from each rank in rank order. ``like`` (a row-count donor, used by the
    backward of :func:`return_rows`) tells the trace the result has its row count."""
    send, receive = sizes.tolist()
    return _all_to_all(rows, send, receive, group_name)


@send_rows.register_fake
def _(rows, sizes, group_name, like=None):
    count = like.shape[0] if like is not None else torch.library.get_ctx().new_dynamic_size()
    return rows.new_empty((count, *rows.shape[1:]))


@torch.library.custom_op("halo::return_rows", mutates_args=())
def return_rows(rows: torch.Tensor, sizes: torch.Tensor, group_name: str, total: int) -> torch.Tensor:
    """The inverse of :func:`send_rows`: each received row back to its source, in the order it was sent,
    followed by zero rows up to ``total`` (for the rows that went nowhere)."""
    send, receive = sizes.tolist()
    return _all_to_all(rows, receive, send, group_name, total)


@return_rows.register_fake
def _(rows, sizes, group_name, total):
    return rows.new_empty((total, *rows.shape[1:]))


def _send_rows_context(ctx, inputs, output):
    rows, sizes, group_name, _ = inputs
    ctx.group_name, ctx.total = group_name, rows.shape[0]
    ctx.save_for_backward(sizes)


def _send_rows_backward(ctx, grad):
    (sizes,) = ctx.saved_tensors
    return return_rows(grad, sizes, ctx.group_name, ctx.total), None, None, None


def _return_rows_context(ctx, inputs, output):
    rows, sizes, group_name, _ = inputs
    ctx.group_name = group_name
    ctx.save_for_backward(sizes, rows.new_empty((rows.shape[0], 0)))  # the second holds the row count, not the rows


def _return_rows_backward(ctx, grad):
    sizes, like = ctx.saved_tensors
    return send_rows(grad, sizes, ctx.group_name, like), None, None, None


send_rows.register_autograd(_send_rows_backward, setup_context=_send_rows_context)
return_rows.register_autograd(_return_rows_backward, setup_context=_return_rows_context)


class KeepExchangesForBackward(CustomGraphPass):
    """Inductor joint-graph pass: the outputs of these operators are saved for backward, never
    recomputed there, as the partitioner does for torch's own functional collectives. Under an
    activation memory budget it otherwise judged them cheap and re-ran, in each layer's backward,
    the forward's read-back and all-to-alls (three more exchanges a layer, measured)."""

    def __call__(self, graph) -> None:
        for node in getattr(graph, "graph", graph).nodes:
            if node.op == "call_function" and getattr(node.target, "namespace", None) == "halo":
                # A tuple result is saved through its items (the partitioner never saves tuples).
                items = [user for user in node.users if getattr(user.target, "__name__", "") == "getitem"]
                for saved in [node, *items]:
                    saved.meta["recompute"] = CheckpointPolicy.MUST_SAVE

    def uuid(self):
        return get_hash_for_files((__file__,))
