"""LoRA on fused experts, computed inside the experts' grouped GEMM: per expert ``A_e`` [r, in] and ``B_e`` [out, r].

PEFT reaches a fused 3-D expert weight only through ``target_parameters``, a parametrization that adds
every expert's whole delta to the weight on each forward (deltas the size of all the experts), with no
dropout and no notion of experts split over ranks. Here a targeted weight ``P`` gets two parameters on the
experts module itself, ``P_lora_A`` [E, r, in] and ``P_lora_B`` [E, out, r], so everything that handles
expert parameters by name handles them too: EP keeps the rank's experts (dim 0), ETP splits ``B`` where
``P``'s output is the intermediate axis (gate/up) and ``A`` where its input is (down), FSDP, gradient sync,
checkpoints and optimizer state treat them as expert parameters. The experts forward
(``grouped_experts``) adds ``s * B_e A_e dropout(x)`` to each projection with two grouped GEMMs of rank r.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from halo_core.integrations.transformers import EXPERTS_FUNCTIONS, grouped_linear

from halo_core.parallel.expert_tensor_parallel import IntermediateSplit


@dataclass(frozen=True)
class ExpertLora:
    """How one fused weight's adapter applies (``ExpertShard.lora`` maps the weight's name to it)."""

    scaling: float
    #: Dropout on the adapter's input, while the experts module trains (``module.training``, so ``eval()`` turns it off).
    dropout: float = 0.0


def names(weight: str) -> tuple[str, str]:
    return f"{weight}_lora_A", f"{weight}_lora_B"


def global_dims(experts: nn.Module, weight: str, shard) -> tuple[int, int]:
    """(out, in) of one expert's whole ``weight``, before EP and ETP took their parts."""
    shape = list(getattr(experts, weight).shape)
    split = shard.etp_splits.get(weight)
    if split is not None:
        shape[split.dim] *= shard.etp_size
    out_dim, in_dim = (2, 1) if experts.is_transposed else (1, 2)
    return shape[out_dim], shape[in_dim]


def peft_initial(num_experts: int, r: int, in_features: int, out_features: int, init) -> tuple[torch.Tensor, torch.Tensor]:
    """The adapter PEFT's ``ParamWrapper`` creates for a fused weight, drawn as it draws it (same generator, same
    order: its two ``nn.Linear``, then ``reset_lora_parameters``), in this module's layout: ``A`` [E, r, in], ``B`` [E, out, r]."""
    lora_a = nn.Linear(in_features, r * num_experts, bias=False)
    lora_b = nn.Linear(r * num_experts, out_features, bias=False)
    if init is True:
        nn.init.kaiming_uniform_(lora_a.weight, a=math.sqrt(5))
        nn.init.zeros_(lora_b.weight)
    elif isinstance(init, str) and init.lower() == "gaussian":
        nn.init.normal_(lora_a.weight, std=1 / r)
        nn.init.zeros_(lora_b.weight)
    elif init is not False:
        raise ValueError(f"init_lora_weights={init!r} is not supported on fused experts (True, 'gaussian' or False)")
    return from_peft(lora_a.weight.detach(), lora_b.weight.detach(), num_experts)


def from_peft(lora_a: torch.Tensor, lora_b: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """PEFT's ``lora_A`` [E*r, in] (expert-major rows) and ``lora_B`` [out, r*E] (expert-minor columns) as [E, r, in], [E, out, r]."""
    out_features = lora_b.shape[0]
    return lora_a.reshape(num_experts, -1, lora_a.shape[-1]), lora_b.reshape(out_features, -1, num_experts).permute(2, 0, 1)


def to_peft(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of ``from_peft``, for whole (all experts) tensors."""
    out_features = b.shape[1]
    return a.reshape(-1, a.shape[-1]).contiguous(), b.permute(1, 2, 0).reshape(out_features, -1).contiguous()


def adapter_splits(experts: nn.Module, weight: str, shard) -> tuple[dict[str, IntermediateSplit], str | None]:
    """How ETP splits the two adapters of ``weight``, and the one it keeps whole on every ETP rank (each rank then
    holds part of its gradient); ``({}, None)`` without ETP."""
    split = shard.etp_splits.get(weight)
    if shard.etp_size == 1 or split is None:
        return {}, None
    a_name, b_name = names(weight)
    out_dim = 2 if experts.is_transposed else 1
    if split.dim == out_dim:  # gate/up: the intermediate axis is the output
        return {b_name: IntermediateSplit(1, split.kind)}, a_name
    return {a_name: IntermediateSplit(2, split.kind)}, b_name


def delta(experts: nn.Module, spec: ExpertLora, weight: str, rows: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``s * B_e A_e dropout(x)`` for rows grouped by expert (``offsets``: the groups' ends)."""
    a_name, b_name = names(weight)
    if spec.dropout and experts.training:
        rows = nn.functional.dropout(rows, spec.dropout)
    low = grouped_linear(rows, getattr(experts, a_name).to(rows.dtype), offsets)
    return grouped_linear(low, getattr(experts, b_name).to(rows.dtype), offsets) * spec.scaling
