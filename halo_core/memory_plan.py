"""``halo plan``'s figures: a run's memory per GPU, from the model's config alone (no weights).

The layout is not modelled: the model is built on the meta device and laid out by ``parallelize`` itself, once per
rank, in a fake process group of the launch's size (``torch.testing``'s ``FakeStore``), so every split, FSDP2 unit and
expert block is the one ``halo launch`` makes. Parameters are each rank's local shards; gradients mirror the trainable
ones; optimizer state is counted per optimizer (``OPTIMIZER_STATE``). Activations are an estimate (``activations``).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

import torch

#: Bytes of optimizer state per trainable element, by the parameter's element size, and per parameter tensor (a step
#: count): torch's AdamW keeps two moments in the parameter's dtype and a float32 ``step`` tensor; SGD without
#: momentum keeps nothing; AdamWBF16 (``bf16: true``) keeps two bf16 moments (+ a Kahan buffer) and a Python step.
OPTIMIZER_STATE = {
    "adamw_torch": (2, 4), "adamw_torch_fused": (2, 4), "adamw_torch_4bit": (2, 4), "adamw_hf": (2, 4), "adam": (2, 4),
    "sgd": (0, 0), "adamw_bf16": (2, 0), "adamw_bf16_kahan": (3, 0),
}
#: Methods that keep a frozen copy of the policy laid out as it is, and when (``train(..., reference=...)`` in each).
REFERENCE = {"dpo": lambda a: not a.precompute_ref_log_probs, "kto": lambda a: not a.precompute_ref_log_probs,
             "grpo": lambda a: a.beta != 0.0, "sdpg": lambda a: a.beta != 0.0}
#: Methods that train the backbone under a sequence-classification head (``score``, that many outputs) instead of the
#: language-model head, as ``train(..., num_labels=...)`` in each builds it.
HEAD_OUTPUTS = {"reward": lambda a: 1, "classify": lambda a: a.num_labels}


@dataclass
class RankBytes:
    rank: int
    parameters: int
    trainable: int
    tensors: int  # trainable parameter tensors (one optimizer step count each)
    largest: int  # the largest local parameter
    unit: int  # the largest FSDP2 unit unsharded on this rank (gathered for its forward and backward)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def tensor_bytes(model, optimizer=None) -> dict:
    """A rank's actual parameter, gradient and optimizer-state bytes (local shards); what ``HALO_TENSOR_BYTES``
    makes a launched run write, and what the planner is held to."""
    params = [p for _, p in model.named_parameters()]
    local = lambda t: _local(t).numel() * _local(t).element_size()  # noqa: E731
    state = 0
    for entry in (optimizer.state.values() if optimizer is not None else ()):
        state += sum(local(v) for v in entry.values() if isinstance(v, torch.Tensor))
    return {"parameters": sum(local(p) for p in params), "gradients": sum(local(p.grad) for p in params if p.grad is not None),
            "optimizer": state}


def _meta_model(model_config, dtype, registry, num_labels: int | None = None):
    """The model on the meta device; ``num_labels``: under a sequence-classification head of that many outputs."""
    from accelerate import init_empty_weights

    from halo_core.parallel.loading import build_from_config, model_class_for, sequence_head

    config = copy.deepcopy(model_config)  # the layout writes the experts' implementation into the config
    if num_labels is not None:
        sequence_head(config, num_labels, None)
    # The meta device too: a parameter built as a real ``torch.zeros`` and moved to meta on registration costs its full
    # size in memory and time first (a third of a plan's time for LFM2-8B's experts).
    with torch.device("meta"), init_empty_weights(include_buffers=False):
        return build_from_config(model_class_for(config, registry, num_labels is not None), config, dtype=dtype)


@contextlib.contextmanager
def _fake_group(rank: int, world: int):
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if world == 1:
        yield
        return
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def _units(model) -> list[list[str]]:
    """The names of each FSDP2 unit's parameters, as ``apply_fsdp`` groups them: a decoder layer each, the input
    embeddings, the output head, and the rest (the root)."""
    from halo_core.parallel.fsdp import decoder_layers

    ids = {id(p): n for n, p in model.named_parameters()}
    groups = [[ids[id(p)] for p in layer.parameters() if id(p) in ids] for layer in decoder_layers(model)]
    for module in (model.get_input_embeddings(), model.get_output_embeddings()):
        if module is not None:
            groups.append([ids[id(p)] for p in module.parameters() if id(p) in ids])
    taken = {n for group in groups for n in group}
    return [*groups, [n for n in ids.values() if n not in taken]]


def rank_bytes(model_config, parallel, world: int, rank: int, dtype, registry, adapters=None, gathered: bool = True,
               num_labels: int | None = None) -> RankBytes:
    """One rank's parameter bytes as ``parallelize`` lays the meta model out, and (``gathered``) its largest FSDP2 unit
    unsharded: the parameters FSDP2 shards (smaller than the same layout without FSDP2) at their unsharded size, by unit."""
    from halo_core.parallel.parallelize import parallelize

    size = lambda p: _local(p).numel() * _local(p).element_size()  # noqa: E731
    with _fake_group(rank, world):
        model = parallelize(_meta_model(model_config, dtype, registry, num_labels), parallel, registry, device_type="cpu")
        if adapters is not None:
            adapters(model)
        named = {n: size(p) for n, p in model.named_parameters()}
        train = [n for n, p in model.named_parameters() if p.requires_grad]
        unit = 0
        if gathered and parallel.fsdp and world > 1:
            flat = type(parallel)(**{**parallel.__dict__, "fsdp": False})
            whole = parallelize(_meta_model(model_config, dtype, registry, num_labels), flat, registry, device_type="cpu")
            unsharded = {n: size(p) for n, p in whole.named_parameters()}
            unit = max(sum(unsharded[n] for n in group if named.get(n, unsharded[n]) < unsharded[n]) for group in _units(whole))
        return RankBytes(rank, sum(named.values()), sum(named[n] for n in train), len(train), max(named.values()), unit)


def activations(model_config, tokens: int, itemsize: int, *, tp: int = 1, etp: int = 1, checkpointing: bool = False,
                budget: float | None = None) -> int:
    """An estimate of the activations one rank keeps for backward, in bytes (``tokens``: the rank's micro-batch
    tokens, ``per_device_train_batch_size x max_length / cp``; ``itemsize``: the compute dtype's).

    Per layer, per token, in elements: attention ``3h + (2q + 2kv)/tp`` (norm in and out, residual, q/k/v, the
    attention output; SDPA keeps no score matrix), then a dense MLP ``2h + 4i/tp`` (gate, up, the activation, its
    product) or a MoE block ``2h + k(2h + 4i_e/etp)`` plus float32 router scores (``4E`` bytes). The logits cost
    ``V(itemsize + 8)`` bytes a token (the logits, their float32 copy for the loss and its gradient). Gradient
    checkpointing keeps each layer's input (``h``) and one layer whole while it is recomputed;
    ``activation_memory_budget`` keeps that share of each compiled layer's. Checked against a GPU's peak by
    ``bench/plan_vs_peak.py``.
    """
    from halo_core.hf_config import text_config
    from halo_core.parallel.plan import EXPERT_COUNT_FIELDS, first_field

    text = text_config(model_config)
    h = text.hidden_size
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or h // heads
    q, kv = heads * head_dim, (getattr(text, "num_key_value_heads", None) or heads) * head_dim
    experts = first_field(model_config, EXPERT_COUNT_FIELDS) or 0
    attention = 3 * h + (2 * q + 2 * kv) / tp
    if experts:
        k = getattr(text, "num_experts_per_tok", None) or getattr(text, "moe_topk", None) or 1
        width = getattr(text, "moe_intermediate_size", None) or text.intermediate_size
        shared = getattr(text, "shared_expert_intermediate_size", None) or 0
        mlp = 2 * h + k * (2 * h + 4 * width / etp) + 4 * shared / tp
        router = 4 * experts
    else:
        mlp, router = 2 * h + 4 * text.intermediate_size / tp, 0
    layer = tokens * ((attention + mlp) * itemsize + router)
    layers = text.num_hidden_layers
    if checkpointing:
        kept = layers * tokens * h * itemsize + layer
    else:
        kept = layers * layer * (budget if budget is not None else 1.0)
    return int(kept + tokens * text.vocab_size * (itemsize + 8))


def global_bytes(model_config, dtype, registry, num_labels: int | None = None) -> int:
    """The whole model's weights (a tied head counted once): the saved model's size on disk."""
    model = _meta_model(model_config, dtype, registry, num_labels)
    return sum(p.numel() * p.element_size() for p in model.parameters())
