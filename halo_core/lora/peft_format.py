"""Adapters in PEFT's own files (``adapter_config.json``, ``adapter_model.safetensors``), whatever the layout.

Keys are what ``PeftModel.save_pretrained`` writes: ``base_model.model.<module>.lora_A.weight``; a fused
expert weight's adapter in ``target_parameters``' layout (``lora_A`` [E*r, in], ``lora_B`` [out, r*E]) under
the experts module, nested as PEFT nests one ``ParamWrapper`` per weight (the first weight deepest:
``experts.base_layer.lora_A.weight``); a module trained whole under its own name. Expert adapters are
gathered from their EP/ETP shards first, so ``PeftModel.from_pretrained`` loads them on one process.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from torch.distributed.tensor import DTensor

from halo_core.lora import grouped
from halo_core.parallel.layout_state import layout_of
from halo_core.parallel.state_dict import gather_full

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."
ADAPTER_NAME = "default"


def adapters_of(model: nn.Module):
    return layout_of(model).adapters


def _expert_keys(adapters) -> dict[str, tuple[str, str, str]]:
    """Halo's ``<module>.<weight>_lora_B`` -> (PEFT's ``lora_A`` key, ``lora_B`` key, weight) for each adapted fused weight."""
    keys = {}
    for module, weights in adapters.experts.items():
        for index, weight in enumerate(weights):
            wrapper = module + ".base_layer" * (len(weights) - 1 - index)
            keys[f"{module}.{weight}"] = (f"{PREFIX}{wrapper}.lora_A.weight", f"{PREFIX}{wrapper}.lora_B.weight", weight)
    return keys


def _dense_key(name: str) -> str:
    return PREFIX + name.replace(f".{ADAPTER_NAME}.", ".")


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole adapter under PEFT's keys, on rank 0 (other ranks: empty); every rank must call it."""
    adapters = adapters_of(model)
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    full = gather_full(model, trained, device="cpu")
    state = {}
    for (module_weight, (key_a, key_b, _)) in _expert_keys(adapters).items():
        a_name, b_name = grouped.names(module_weight)
        if a_name in full:
            state[key_a], state[key_b] = grouped.to_peft(full.pop(a_name), full.pop(b_name))
    for name, tensor in full.items():
        state[_dense_key(name)] = tensor.contiguous()
    return state


def write_adapter(model: nn.Module, state: dict[str, torch.Tensor], folder: Path) -> None:
    """The adapter files (``adapter_state``'s tensors) in ``folder``; rank 0 alone, no collectives."""
    import copy

    adapters = adapters_of(model)
    config = copy.copy(adapters.config)
    config.base_model_name_or_path = adapters.base_model
    config.inference_mode = True
    if config.target_parameters:
        # PEFT's ParamWrapper refuses any lora_dropout, also when loading for inference, where dropout does nothing.
        config.lora_dropout = 0.0
    config.save_pretrained(str(folder))
    save_file(state, str(folder / ADAPTER_WEIGHTS), metadata={"format": "pt"})


def is_adapter_folder(folder: str | Path) -> bool:
    return (Path(folder) / ADAPTER_CONFIG).exists() and (Path(folder) / ADAPTER_WEIGHTS).exists()


@torch.no_grad()
def load_adapter(model: nn.Module, folder: str | Path) -> None:
    """Fill the laid-out model's adapters (and modules trained whole) from PEFT files: a resume."""
    from halo_core.parallel.loading import CheckpointError, expert_rows, place

    adapters = adapters_of(model)
    layout = layout_of(model)
    with safe_open(str(Path(folder) / ADAPTER_WEIGHTS), "pt") as handle:
        stored = {key: handle.get_tensor(key) for key in handle.keys()}
    expert = {}
    for module_weight, (key_a, key_b, weight) in _expert_keys(adapters).items():
        if key_a in stored:
            num_experts = layout.experts[module_weight.rsplit(".", 1)[0]].num_experts
            a, b = grouped.from_peft(stored.pop(key_a), stored.pop(key_b), num_experts)
            a_name, b_name = grouped.names(module_weight)
            expert[a_name], expert[b_name] = a, b
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        block = expert.get(name, stored.get(_dense_key(name)))
        if block is None:
            raise CheckpointError(f"{folder}/{ADAPTER_WEIGHTS} lacks the adapter weight {name}; it was written for other targets")
        rows = expert_rows(model, name)
        if rows is not None:
            block = block[rows[0] : rows[1]]
        local = place(model, name, param, block.to(param.dtype))
        if isinstance(param, DTensor):  # TP-split adapters, FSDP2-sharded modules trained whole
            param.to_local().copy_(local.to_local())
        else:
            param.copy_(local)


def base_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The frozen base under its Hugging Face names (PEFT's ``base_layer`` removed, adapters left out), on rank 0."""
    named = [(n, p) for n, p in model.state_dict().items() if not is_adapter(n, model)]
    full = gather_full(model, named, device="cpu")
    return {n.replace(".base_layer.", "."): t for n, t in full.items()}


def is_adapter(name: str, model: nn.Module) -> bool:
    adapters = adapters_of(model)
    return name in adapters.dense or any(name == grouped_name for m, ws in adapters.experts.items() for w in ws
                                         for grouped_name in (f"{m}.{n}" for n in grouped.names(w)))


def read_config(folder: str | Path) -> dict:
    return json.loads((Path(folder) / ADAPTER_CONFIG).read_text())
