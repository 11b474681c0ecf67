"""JetMoE (``jetmoe``): how it differs from the common case.

- MoE block ``model.layers.*.mlp`` (``JetMoeMoE``): router ``router`` (``JetMoeTopKGating``: top-k of the logits,
  softmax over those k), experts in two ``JetMoeParallelExperts`` children, ``input_linear`` (``[E, 2I, H]``, gate
  then up) and ``output_linear`` (``[E, H, I]``), and a bias ``[H]`` added after them. transformers gives these
  experts no experts interface, so under EP the block runs ``_forward`` below: the router's own expert-sorted
  choice read back per token, the two weights split by whole experts under their own names (``shard_experts``
  with ``parameters``), and each rank running JetMoE's own arithmetic on the rows its experts receive. At one rank
  the block stays transformers' own.
- Attention (``self_attention``) is a mixture of attention heads (``JetMoeMoA``, a router and experts of its own
  for the query and output projections): small, kept whole on every rank and sharded by FSDP2 with its layer.
- CP runs through the attention registry as in the common case (the experts' key/value heads are repeated per
  chosen expert before the attention function). Not declared: ``etp`` (it slices the interface's weights) and
  ``tp`` (no plan for the attention experts).
"""

from __future__ import annotations

import types

import torch
from torch import nn

from halo_core import Family, hookimpl
from halo_core.parallel.expert_parallel import distributed_experts, shard_experts
from halo_core.parallel.row_order import inverse_permutation

__version__ = "0.1.0"

EXPERT_WEIGHTS = ("input_linear.weight", "output_linear.weight")


@hookimpl
def halo_family() -> Family:
    return Family(
        name="jetmoe",
        model_types=("jetmoe",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep", "cp"}),
        moe_block="model.layers.*.mlp",
        router="router",
        experts="input_linear",
        attention="model.layers.*.self_attention",
    )


def _local_experts(block: nn.Module, rows: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``JetMoeMoE``'s expert arithmetic on the rows this rank's experts received (``ids``: local expert per row)."""
    ids = ids[:, 0]
    order = torch.argsort(ids, stable=True)
    sizes = torch.bincount(ids, minlength=block.input_linear.num_experts).tolist()  # JetMoE splits rows on the host
    gate, up = block.input_linear(rows.index_select(0, order), sizes).chunk(2, dim=-1)
    out = block.output_linear(block.activation(gate) * up, sizes)
    return out.index_select(0, inverse_permutation(order)) * weights


def _forward(self: nn.Module, layer_input: torch.Tensor) -> torch.Tensor:
    """``JetMoeMoE.forward`` with the experts distributed. The router lists its (token, slot) pairs sorted by
    expert (``index_sorted``, with ``expert_size`` per expert); undoing that sort gives each token its experts and
    gates as the experts interface takes them."""
    flat = layer_input.reshape(-1, layer_input.shape[-1])
    index_sorted, _, batch_gates, expert_size, _ = self.router(flat)
    sizes = torch.tensor(expert_size, device=flat.device)
    sorted_experts = torch.repeat_interleave(torch.arange(len(expert_size), device=flat.device), sizes)
    slot = inverse_permutation(index_sorted)  # (token, slot) pair -> its place in the sorted list
    top_k = self.router.top_k
    out = distributed_experts(self, flat, sorted_experts[slot].view(-1, top_k), batch_gates[slot].view(-1, top_k))
    return out.view(layer_input.shape) + self.bias


@hookimpl
def wrap_moe_block(module: nn.Module, context):
    if context.ep == 1 and context.etp == 1:
        return None  # transformers' own block
    shard_experts(module, context.local_rank("ep"), context.ep, context.ep_dispatcher, parameters=EXPERT_WEIGHTS, compute=_local_experts)
    module.input_linear.num_experts = module.output_linear.num_experts = module.input_linear.weight.shape[0]
    module.forward = types.MethodType(_forward, module)
    return module
