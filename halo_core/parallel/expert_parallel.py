"""Expert parallelism at transformers' experts interface.

Each EP rank keeps a contiguous block of ``num_experts / ep`` experts of the module's own
fused 3-D parameters. The model keeps its router; its experts forward is switched to the
``halo_ep`` implementation registered in transformers' ``ALL_EXPERTS_FUNCTIONS``, which
sends each (token, expert) pair to the rank owning the expert, runs the experts
implementation the model was using on the local block (for ``grouped_mm``, the default, its
arithmetic on the rows as they arrive: ``grouped_experts``), sends the results back and
combines them with the routing weights where they came from. Every reordering of pairs has a
backward that gathers (``row_order``).
With expert-tensor parallelism the same path runs on the tokens its ETP group gathered,
on a slice of each expert's intermediate dimension (``expert_tensor_parallel``).

Experts outside the interface keep their own names and shapes. A module called as the interface is (the
same forward arguments) but not decorated (DBRX's) runs its own forward on this rank's experts, its weights
split by whole experts along dim 0 where they stack them (``[E * I, H]``). Fused experts whose forward takes
expert-major rows alone (Llama 4's, every token for every expert) exchange whole blocks of rows. A block that
routes another way (JetMoE's) names its ``[E, ...]`` expert weights and the arithmetic on this rank's experts
(``compute``) and calls ``distributed_experts`` itself.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch import nn
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

from halo_core.errors import LayoutError
from halo_core.layout import has_interface_signature, stacked_expert_count, takes_expert_major_rows
from halo_core.parallel import expert_tensor_parallel as etp_engine
from halo_core.parallel import grouped_experts
from halo_core.parallel.dispatch import TokenDispatcher
from halo_core.parallel.layout_state import register_shard, shard_of
from halo_core.parallel.row_order import ExpandToPairs, PermuteRows, inverse_permutation

IMPLEMENTATION = "halo_ep"


@dataclass
class ExpertShard:
    """What one EP rank holds of one experts module, and how it talks to its peers."""

    first: int
    count: int
    num_experts: int
    ep_size: int
    dispatcher: TokenDispatcher
    inner: Callable[..., torch.Tensor]
    etp_size: int = 1
    etp_rank: int = 0
    etp_group: Any = None
    #: Parameter name -> how it is split over the ETP ranks; ``etp_whole`` ones every ETP rank holds whole.
    etp_splits: dict = field(default_factory=dict)
    etp_whole: tuple[str, ...] = ()
    #: Fused weight name -> its grouped LoRA (``halo_core.lora.grouped.ExpertLora``), applied in the grouped GEMM.
    lora: dict = field(default_factory=dict)
    #: Expert parameter (its name under the experts module, dotted for a child's) -> rows per expert along dim 0:
    #: 1 for ``[E, ...]`` weights, ``I`` for a ``[E * I, ...]`` stack.
    rows: dict = field(default_factory=dict)


class LocalDispatch:
    """The dispatcher of a one-rank EP group (``etp`` without ``ep``, or LoRA on the experts at EP1): every pair
    stays here. Pairs sent nowhere (sorted last) are zeroed rather than cut off: cutting needs their count on the
    host, a sync that also broke each compiled layer into eight graphs."""

    def dispatch(self, tokens, counts):
        kept = torch.arange(tokens.shape[0], device=tokens.device) < counts.sum()
        return torch.where(kept.unsqueeze(-1), tokens, 0), counts, kept

    def combine(self, expert_output, kept):
        return torch.where(kept.unsqueeze(-1), expert_output, 0)


def expert_parameters(experts: nn.Module, num_experts: int) -> dict[str, int]:
    """The experts module's parameters with one slice per expert, each with its rows per expert along dim 0.

    Its and its children's ``[E, ...]`` weights where it has any (the interface's layout; Ergo's per-expert
    ``post_expert_norm.weight`` beside it); otherwise those whose dim 0 stacks ``E`` equal blocks (DBRX's
    ``mlp.w1``, ``[E * I, H]``)."""
    exact = {n: 1 for n, p in experts.named_parameters() if p.dim() >= 2 and p.shape[0] == num_experts}
    if exact:
        return exact
    return {n: p.shape[0] // num_experts for n, p in experts.named_parameters() if p.dim() >= 2 and p.shape[0] % num_experts == 0}


def count_experts(experts: nn.Module) -> int:
    shapes = [p.shape[0] for p in experts.parameters(recurse=False) if p.dim() == 3]
    if shapes:
        return shapes[0]
    stacked = stacked_expert_count(experts)
    if stacked is not None:
        return stacked
    raise LayoutError(f"{type(experts).__name__} holds no fused 3-D expert weights, nor 2-D weights stacking its num_experts "
                      f"experts behind the experts interface's forward; implement wrap_moe_block in the family plugin")


def _inner_implementation(experts: nn.Module) -> Callable[..., torch.Tensor]:
    name = experts.config._experts_implementation
    if name in (None, "eager"):
        return type(experts).forward.__wrapped__
    if name == IMPLEMENTATION:
        raise LayoutError("this experts module is already expert-parallel; parallelize() a model only once")
    return ALL_EXPERTS_FUNCTIONS[name]


def is_interface(experts: nn.Module) -> bool:
    """Whether the module's own forward is transformers' dispatching one (``@use_experts_implementation``). Not so
    for a subclass whose forward calls the decorated one and adds to it (Ergo's per-expert norm): the model's
    implementation must stay its own for that inner call, and the subclass's forward is switched instead."""
    return hasattr(type(experts).forward, "__wrapped__") and hasattr(experts, "is_transposed")


def _own_forward(experts: nn.Module, rows: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """An undecorated experts module's own forward (its class's, eager) on this rank's experts, one row per pair.

    A rank that receives no rows runs one zero row of weight zero after them: modeling code need not take empty
    inputs (DBRX's reshapes to ``[0, -1, hidden]``). The row is appended to the received ones, so the backward still
    runs through the exchange that brought them, a collective every rank must join."""
    received = rows.shape[0]
    if received == 0:
        rows = torch.cat([rows, rows.new_zeros(1, rows.shape[1])])
        top_k_index = torch.cat([top_k_index, top_k_index.new_zeros(1, top_k_index.shape[1])])
        top_k_weights = torch.cat([top_k_weights, top_k_weights.new_zeros(1, top_k_weights.shape[1])])
    return type(experts).forward(experts, rows, top_k_index, top_k_weights).reshape(rows.shape[0], -1)[:received]


def _undecorated_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """What an undecorated experts module's forward becomes under EP (transformers cannot switch it): the
    ``halo_ep`` path, on tokens of any leading shape (DBRX passes ``[batch, seq, hidden]``), shaped as they came."""
    flat = hidden_states.reshape(-1, hidden_states.shape[-1])
    return expert_parallel_forward(self, flat, top_k_index, top_k_weights).view(hidden_states.shape)


def _own_expert_major_forward(experts: nn.Module, rows: torch.Tensor) -> torch.Tensor:
    """Expert-major experts' own forward on this rank's experts (every one gets the same number of rows). With no
    rows, one zero row per expert appended to them, so modeling code need not take empty inputs and the backward
    still runs through the exchange that brought them."""
    received = rows.shape[0]
    if received == 0:
        rows = torch.cat([rows, rows.new_zeros(experts.num_experts, rows.shape[1])])
    return type(experts).forward(experts, rows)[:received]


def _expert_major_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """What expert-major experts' forward becomes under EP (Llama 4's run every token through every expert, the
    unchosen ones on zero rows): each expert's block of rows goes to the rank holding it, whole; the rank runs the
    module's own forward on its experts' blocks from every source, and the results go back. The exchange moves
    every token once per expert, as the module computes it; a family that sends only the chosen pairs does so in
    its own hook (halo-plugin-llama4)."""
    shard: ExpertShard = shard_of(self)
    tokens = hidden_states.shape[0] // shard.num_experts
    counts = torch.full((shard.ep_size, shard.count), tokens, dtype=torch.long, device=hidden_states.device)
    received, received_counts, handle = shard.dispatcher.dispatch(hidden_states, counts)
    expert = _row_experts(received_counts, received.shape[0], shard.count)  # rows come by source, then expert
    order = torch.argsort(expert, stable=True)
    inverse = inverse_permutation(order)
    out = shard.inner(self, PermuteRows.apply(received, order, inverse))
    return shard.dispatcher.combine(PermuteRows.apply(out, inverse, order), handle)


def shard_experts(experts: nn.Module, ep_rank: int, ep_size: int, dispatcher: TokenDispatcher | None, *, etp_rank: int = 0, etp_size: int = 1, etp_group=None,
                  parameters: Iterable[str] | None = None, compute: Callable[..., torch.Tensor] | None = None) -> None:
    """Keep this rank's block of experts (and, with ETP, its slice of their intermediate dimension) in place,
    and register what the ``halo_ep`` forward needs with the layout.

    ``experts``: a module at transformers' experts interface; or, with a forward of its own that this switches to
    the exchange, one taking the interface's arguments undecorated (DBRX's) or fused experts taking expert-major
    rows alone (Llama 4's). A block that routes without the interface names its ``[E, ...]`` expert weights
    (``parameters``, dotted names under ``experts``) and the arithmetic on this rank's experts
    (``compute(experts, rows, local_ids[R, 1], weights[R, 1])``), and calls ``distributed_experts``."""
    switched = None
    if compute is None and not is_interface(experts):
        if has_interface_signature(experts):
            compute, switched = _own_forward, _undecorated_forward
        elif takes_expert_major_rows(experts):
            compute, switched = _own_expert_major_forward, _expert_major_forward
        else:
            raise LayoutError(
                f"{type(experts).__name__} does not use transformers' @use_experts_implementation, nor take its forward "
                f"arguments or expert-major rows alone, so the core cannot distribute it; implement wrap_moe_block in the family plugin"
            )
    if etp_size > 1 and compute is not None:
        raise LayoutError(f"{type(experts).__name__} is not at transformers' experts interface; expert-tensor parallelism "
                          f"slices the interface's weights (gate_up_proj/up_proj, down_proj): drop etp")
    if parameters is not None:
        parameters = list(parameters)
        num_experts = experts.get_parameter(parameters[0]).shape[0]
        rows = {n: 1 for n in parameters}
    else:
        num_experts = count_experts(experts)
        rows = expert_parameters(experts, num_experts)
    count = num_experts // ep_size
    first = ep_rank * count
    inner = compute or _inner_implementation(experts)
    splits, whole = etp_engine.intermediate_splits(experts) if etp_size > 1 else ({}, [])
    for name, per_expert in rows.items():
        owner_name, _, leaf = name.rpartition(".")
        owner = experts.get_submodule(owner_name) if owner_name else experts
        full = getattr(owner, leaf)
        if full.shape[0] != num_experts * per_expert:
            raise LayoutError(f"{type(experts).__name__}.{name} has {full.shape[0]} rows, not {num_experts} experts' worth")
        local = full.detach()[first * per_expert : (first + count) * per_expert]
        if name in splits:
            local = etp_engine.take_slice(local, splits[name], etp_rank, etp_size)
        setattr(owner, leaf, nn.Parameter(local.clone(), requires_grad=full.requires_grad))
    experts.num_experts = count
    if switched is not None:
        experts.forward = types.MethodType(switched, experts)
    register_shard(experts, ExpertShard(
        first, count, num_experts, ep_size, dispatcher or LocalDispatch(), inner, etp_size, etp_rank, etp_group, splits, tuple(whole), rows=rows
    ))


def expert_parallel_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """The ``halo_ep`` experts implementation: same signature and result as transformers' own."""
    shard: ExpertShard = shard_of(self)
    if shard.etp_size == 1:
        return _dispatch_and_compute(self, shard, hidden_states, top_k_index, top_k_weights)
    counts = etp_engine.row_counts(hidden_states.shape[0], shard.etp_group, hidden_states.device)
    hidden = etp_engine.GatherRows.apply(hidden_states, counts, shard.etp_rank, shard.etp_group)
    weights = etp_engine.GatherRows.apply(top_k_weights, counts, shard.etp_rank, shard.etp_group)
    index = etp_engine.gather_rows(top_k_index, counts, shard.etp_group)
    partial = _dispatch_and_compute(self, shard, hidden, index, weights)
    return etp_engine.ReduceScatterRows.apply(partial, counts, shard.etp_rank, shard.etp_group)


def _dispatch_and_compute(self: nn.Module, shard: ExpertShard, hidden_states, top_k_index, top_k_weights) -> torch.Tensor:
    """Expert ids outside ``[0, num_experts)`` (a router's "skip" class, transformers' EP
    sentinels) are sent nowhere and contribute nothing, as in transformers' implementations.

    Pairs are sorted by expert, which with contiguous expert blocks is by destination rank and
    then local expert; only the per-expert counts travel, and each receiving rank rebuilds its
    rows' local expert ids from them on the device."""
    num_tokens, top_k = top_k_index.shape
    expert_ids = top_k_index.reshape(-1)
    valid = (expert_ids >= 0) & (expert_ids < shard.num_experts)
    expert_ids = torch.where(valid, expert_ids, shard.num_experts)  # sent nowhere: sorted last, not counted
    order = torch.argsort(expert_ids, stable=True)
    # Not bincount: its output size depends on the data (a host sync, and a graph break in compiled layers).
    counts = expert_ids.new_zeros(shard.num_experts + 1).scatter_add_(0, expert_ids, torch.ones_like(expert_ids))
    counts = counts[: shard.num_experts].view(shard.ep_size, shard.count)
    inverse = inverse_permutation(order)
    tokens = ExpandToPairs.apply(hidden_states, order, inverse, top_k)

    received, received_counts, handle = shard.dispatcher.dispatch(tokens, counts)
    received_ids = _row_experts(received_counts, received.shape[0], shard.count)
    if grouped_experts.handles(self, shard.inner):
        expert_output = grouped_experts.grouped_mm_received(self, received, received_ids, received_counts)
    else:
        ones = torch.ones((received.shape[0], 1), dtype=top_k_weights.dtype, device=received.device)
        expert_output = shard.inner(self, received, received_ids.unsqueeze(1), ones)
    if received.requires_grad and not expert_output.requires_grad:
        # transformers' eager experts loop over the experts that got rows: a rank that got none returns zeros on no
        # graph, and its backward would skip the exchange every other rank joins (a hang). Tie them to the rows.
        expert_output = expert_output + received.sum() * 0
    if shard.etp_rank > 0:  # a whole down-projection bias counts once per ETP group: the first rank's
        for name in shard.etp_whole:
            expert_output = expert_output - getattr(self, name).index_select(0, received_ids).to(expert_output.dtype)
    returned = shard.dispatcher.combine(expert_output, handle)  # row i: the pair order[i]
    per_pair = PermuteRows.apply(returned, inverse, order).view(num_tokens, top_k, -1)
    return (per_pair * top_k_weights.unsqueeze(-1)).sum(dim=1).to(hidden_states.dtype)


def _row_experts(counts: torch.Tensor, rows: int, count: int) -> torch.Tensor:
    """Each received row's local expert, rows grouped by (source, expert) ``counts[s, e]`` each; rows past the
    counted ones (``LocalDispatch``'s zeroed pairs) get expert 0. On the device, no host sync."""
    ends = torch.cumsum(counts.reshape(-1), dim=0)
    group = torch.searchsorted(ends, torch.arange(rows, device=counts.device), right=True)
    return group % count


ALL_EXPERTS_FUNCTIONS.register(IMPLEMENTATION, expert_parallel_forward)
#: For a block that routes without the interface (``shard_experts(compute=...)``): its experts, distributed.
distributed_experts = expert_parallel_forward


def uses_expert_parallel(module: nn.Module) -> bool:
    return shard_of(module, ExpertShard) is not None
