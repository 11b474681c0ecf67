"""The receiving rank's experts, on rows that arrive grouped by (source rank, local expert).

transformers' ``grouped_mm`` implementation, called on these rows as one pair per row with
unit weights, sorts them by expert again, weights them by ones, and restores their order by
advanced indexing, whose backward adds into zero-filled buffers (atomic adds on the GPU)
although each order is a permutation. Here the expert-major order is applied and undone by
gathers whose backwards are gathers too (``row_order``), and needs none with one source. The
expert arithmetic is transformers' own (``_grouped_linear``, the module's ``_apply_gate``,
biases and post-expert norm as its ``grouped_mm`` applies them), so results match it.

Only the expert-parallel path uses it: on one rank Inductor already fuses most of
``grouped_mm``'s indexing, so EP1 keeps transformers' own (measured: no gain at EP1, about
10% off a compiled EP2 layer, see agent-docs/benchmarks-history.md).
"""

from __future__ import annotations

import torch
from torch import nn
from halo_core.integrations.transformers import EXPERTS_FUNCTIONS, grouped_linear

from halo_core.lora import grouped as lora
from halo_core.parallel.layout_state import shard_of
from halo_core.parallel.row_order import PermuteRows, inverse_permutation


_NEEDS = ("has_gate", "has_bias", "is_transposed", "_apply_gate")


def handles(experts: nn.Module, inner) -> bool:
    """Whether ``inner`` (the experts implementation the model was using) is the one this replaces, in a
    transformers that has what this calls (halo_core.integrations.transformers checks it at import)."""
    return inner is EXPERTS_FUNCTIONS["grouped_mm"] and all(hasattr(experts, n) for n in _NEEDS)


def grouped_mm_received(experts: nn.Module, rows: torch.Tensor, expert_ids: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Each received row through its local expert, in the rows' order. ``expert_ids``: each row's local
    expert; ``counts[s, e]``: rows from source ``s`` for expert ``e`` (rows grouped so)."""
    per_expert = counts.sum(0)
    if counts.shape[0] == 1:  # one source: already expert-major
        return _expert_rows(experts, rows, expert_ids, per_expert)
    order = torch.argsort(expert_ids, stable=True)  # expert-major position -> row
    inverse = inverse_permutation(order)
    out = _expert_rows(experts, PermuteRows.apply(rows, order, inverse), expert_ids.index_select(0, order), per_expert)
    return PermuteRows.apply(out, inverse, order)


def _expert_rows(experts: nn.Module, rows: torch.Tensor, ids: torch.Tensor, per_expert: torch.Tensor) -> torch.Tensor:
    """Rows grouped by expert, ``per_expert`` each (``ids``: each row's expert), through their experts
    (with the grouped LoRA of each adapted weight, ``halo_core.lora.grouped``)."""
    offsets = torch.cumsum(per_expert, dim=0, dtype=torch.int32)
    shard = shard_of(experts)
    adapters = shard.lora if shard is not None else {}
    up_name = "gate_up_proj" if experts.has_gate else "up_proj"
    out = grouped_linear(rows, getattr(experts, up_name), offsets, bias=_bias(experts, f"{up_name}_bias", ids), is_transposed=experts.is_transposed)
    if up_name in adapters:
        out = out + lora.delta(experts, adapters[up_name], up_name, rows, offsets)
    out = experts._apply_gate(out) if experts.has_gate else experts.act_fn(out)
    down = grouped_linear(out, experts.down_proj, offsets, bias=_bias(experts, "down_proj_bias", ids), is_transposed=experts.is_transposed)
    if "down_proj" in adapters:
        down = down + lora.delta(experts, adapters["down_proj"], "down_proj", out, offsets)
    return experts.post_expert_norm(down) if getattr(experts, "has_post_expert_norm", False) else down


def _bias(experts: nn.Module, name: str, ids: torch.Tensor):
    return getattr(experts, name)[ids] if experts.has_bias else None
