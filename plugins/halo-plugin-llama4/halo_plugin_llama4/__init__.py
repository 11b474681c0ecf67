"""Llama 4's text model (``llama4_text``): how it differs from the common case.

- Router: child ``router``, an ``nn.Linear`` whose top-k logits go through a sigmoid; the scores scale each
  expert's *input*, not its output.
- Experts: ``Llama4TextExperts`` (``gate_up_proj`` [E, H, 2I], ``down_proj`` [E, I, H]) runs every token through
  every expert, unselected ones on a zero input, and has no experts interface. The core would distribute it as it
  is (expert-major rows, every token sent once per expert); to send only the chosen pairs, under EP or ETP the
  block is rewritten (``wrap_moe_block``): the same parameters, under the same names, move into an experts-interface module,
  and the block sends each (token, chosen expert) pair, its input already scaled, as one row with weight 1. An
  expert on a zero input gives exactly zero (no biases, ``act(0) * 0``), so the sum over chosen experts is the sum
  over all of them. At one rank the block stays transformers' own.
- Shared expert: ``shared_expert``, a dense MLP every rank keeps whole.
- ``interleave_moe_layer_step`` / ``moe_layers`` make some layers dense (``Llama4TextMLP``, no router): skipped.
- Not declared: ``etp`` (the core reads the expert layout flags before this hook has put the interface module in
  place) and ``tp``. TRL's auxiliary loss reads ``num_experts``, which this config calls ``num_local_experts``:
  train with ``router_aux_loss_coef: 0.0`` (troubleshooting).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, use_experts_implementation

from halo_core import Family, hookimpl

__version__ = "0.1.0"


@hookimpl
def halo_family() -> Family:
    return Family(
        name="llama4",
        model_types=("llama4_text",),
        version=__version__,
        api_version=1,
        splits=frozenset({"ep", "cp"}),
        moe_block="model.layers.*.feed_forward",
        router="router",
        experts="experts",
        attention="model.layers.*.self_attn",
    )


@use_experts_implementation(is_transposed=True)
class Llama4InterfaceExperts(nn.Module):
    """``Llama4TextExperts``' parameters at transformers' experts interface (transposed, concatenated gate/up)."""

    def __init__(self, config, experts: nn.Module) -> None:
        super().__init__()
        self.num_experts = experts.num_experts
        self.gate_up_proj = experts.gate_up_proj
        self.down_proj = experts.down_proj
        self.act_fn = experts.act_fn

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        """Only reached under an implementation the interface does not know; the block sets ``grouped_mm``."""
        return ALL_EXPERTS_FUNCTIONS["grouped_mm"](self, hidden_states, top_k_index, top_k_weights)


def _sparse_forward(self: nn.Module, hidden_states: torch.Tensor):
    """``Llama4TextMoe.forward`` with the experts run on the chosen (token, expert) pairs only."""
    hidden = hidden_states.reshape(-1, self.hidden_dim)
    scores, logits = self.router(hidden)
    # The router's choice, read off its scores (zero off the chosen experts), so a replayed routing (which replays
    # the router's own top-k) is the one used here; a chosen score that underflows to zero adds zero either way.
    index = torch.topk(scores, self.router.top_k, dim=1).indices
    routed_in = hidden.unsqueeze(1) * scores.gather(1, index).unsqueeze(-1)  # [tokens, k, hidden], as the block scales
    pairs = routed_in.reshape(-1, self.hidden_dim)
    ones = torch.ones((pairs.shape[0], 1), dtype=scores.dtype, device=pairs.device)
    routed_out = self.experts(pairs, index.reshape(-1, 1), ones).view(hidden.shape[0], -1, self.hidden_dim)
    out = self.shared_expert(hidden)
    out.add_(routed_out.sum(dim=1))
    return out, logits


@hookimpl
def wrap_moe_block(module: nn.Module, context):
    if context.ep == 1 and context.etp == 1:
        return None  # transformers' own block
    # A config of the experts' own: transformers does not let a Llama 4 model switch experts implementations.
    config = copy.copy(context.model_config)
    config._experts_implementation_internal = "grouped_mm"
    module.experts = Llama4InterfaceExperts(config, module.experts)
    module.forward = _sparse_forward.__get__(module)
    return None  # the core's default now distributes the interface module
