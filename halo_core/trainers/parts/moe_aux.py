"""The router's load-balancing loss (``router_aux_loss_coef``) over the global batch, so layouts match one process.

transformers' MoE models compute it in their modeling module's ``load_balancing_loss_func`` (Switch Transformer's
``E * sum_e f_e * P_e``: ``f_e`` the share of routed (token, choice) pairs expert ``e`` got, ``P_e`` its mean router
probability, both over every layer's real tokens). Per rank, as stock data parallelism computes it, it is a
function of the rank's own tokens: another number than one process's on the whole batch. Here ``f_e`` and the
token count are summed over every rank (one all-reduce; the TP ranks of a group routed the same tokens, so
divided by ``tp``), and ``P_e``'s sum is this rank's own tokens' part, which carries its gradient: the returned
value is this rank's share of the global loss times the processes, the form TRL's loss already has after its
world-size scaling, so Halo's CP x TP division and data-parallel average treat it as they treat the token loss.
One process computes the stock value. Padding is left out by the batch's attention mask or, where Halo's CP x TP
split dropped it, by this rank's token mask (``parts.moe_load``).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

NAME = "load_balancing_loss_func"


def global_loss(load, gate_logits, num_experts=None, top_k=2, attention_mask=None):
    """Drop-in for the modeling module's function (same arguments), over the global batch."""
    if gate_logits is None or not isinstance(gate_logits, tuple):
        return 0
    device = gate_logits[0].device
    mask = attention_mask
    if mask is None and load is not None and load.mask is not None and load.mask.numel() == gate_logits[0].shape[0]:
        mask = load.mask
    rows = gate_logits[0].shape[0]
    flat = torch.ones(rows, device=device) if mask is None else mask.reshape(-1).to(device=device, dtype=torch.float32)
    counts = torch.zeros(num_experts, dtype=torch.float32, device=device)
    probs = torch.zeros(num_experts, dtype=torch.float32, device=device)
    for layer in gate_logits:
        weights = torch.nn.functional.softmax(layer.to(device), dim=-1)
        _, chosen = torch.topk(weights, top_k, dim=-1)
        counts = counts.scatter_add(0, chosen.reshape(-1), flat.repeat_interleave(top_k))
        probs = probs + (weights.float() * flat.unsqueeze(-1)).sum(dim=0)
    totals = torch.cat([counts, (flat.sum() * len(gate_logits)).reshape(1)]).detach()
    world = 1
    if dist.is_initialized() and dist.get_world_size() > 1:
        world = dist.get_world_size()
        dist.all_reduce(totals)
        totals = totals / (load.layout.dims.tp if load is not None else 1)
    total = totals[-1].clamp(min=1)
    return (totals[:-1] / total * probs / total).sum() * num_experts * world


#: TRL's fused LM head (``trl.trainer.utils``) computes the loss with Mixtral's function, imported at each call.
TRL_SOURCE = "transformers.models.mixtral.modeling_mixtral"


def install(model, load) -> None:
    """Switch the model's modeling module, and the one TRL's fused head reads, to the global-batch loss."""
    import importlib

    for name in {type(model).__module__, TRL_SOURCE}:
        module = sys.modules.get(name) or importlib.import_module(name)
        if callable(getattr(module, NAME, None)):
            _patch(module, load)


def _patch(module, load) -> None:
    original = getattr(module, NAME)
    if getattr(original, "halo_global", False):
        original.halo_load = load
        return

    def patched(gate_logits, num_experts=None, top_k=2, attention_mask=None):
        return global_loss(patched.halo_load, gate_logits, num_experts, top_k, attention_mask)

    patched.halo_global, patched.halo_load, patched.stock = True, load, original
    setattr(module, NAME, patched)


def per_group_metric(trainer) -> None:
    """Before TRL averages its logged ``aux_loss`` (each rank's value, gathered): every TP rank of a group returned
    its group's share times the processes, so the mean over ranks counts each group ``tp`` times; divide it out."""
    tp = trainer._halo_moe.layout.dims.tp if getattr(trainer, "_halo_moe", None) is not None else 1
    metrics = getattr(trainer, "_metrics", None)
    if tp == 1 or not isinstance(metrics, dict):
        return
    mode = "train" if trainer.model.training else "eval"
    values = metrics.get(mode, {}).get("aux_loss")
    if values:
        values[:] = [v / tp for v in values]
