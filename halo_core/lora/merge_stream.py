"""The merged model's weights one at a time: each base weight read as transformers' conversion mapping makes it, and
the adapter merged into it by PEFT's own layer, module by module.

PEFT's ``merge_and_unload`` calls each adapted layer's ``merge()`` on the whole loaded model. Here the adapter is loaded
by PEFT over the base built on the meta device (``PeftModel.from_pretrained(..., low_cpu_mem_usage=True)``: PEFT's own
targeting, ``rank_pattern``/``alpha_pattern``, rsLoRA scaling, ``fan_in_fan_out``, nested ``ParamWrapper``\\ s of
``target_parameters``, ``modules_to_save``), its weights cast as PEFT casts them when it loads over a real base
(``cast_adapter_dtype``: float32). Then, for each adapted layer in turn, only the base tensors its ``merge()`` touches
are made real (read from the checkpoint in the dtype ``from_pretrained`` gives them), ``merge()`` runs, and the result
is taken and the layer's parameter put back on the meta device. Same code, same dtypes, same operands: the merged
values are PEFT's bit for bit. Nothing but the adapter and the tensors of the group being written is ever held.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from halo_core.errors import ConfigError
from halo_core.lora.merge_base import Base
from halo_core.parallel import conversion
from halo_core.parallel.loading import Checkpoint, CheckpointError, ReadLog

ADAPTER = "default"


@dataclass
class Unit:
    """One adapted PEFT layer: its ``merge()`` changes the base tensors ``leaves`` names (merged name -> attribute of
    ``layer``, the innermost base layer)."""

    peft_layer: nn.Module
    layer: nn.Module
    leaves: dict[str, str]


def unwrapped(path: str) -> str:
    """A module's name in the merged model: PEFT's ``base_layer`` levels removed (``merge_and_unload`` unwraps them)."""
    return ".".join(part for part in path.split(".") if part != "base_layer")


def load_adapter(base: Base, adapter_dir: Path) -> nn.Module:
    """PEFT's model of ``adapter_dir`` over a meta copy of the base (the adapter's tensors real, the base's on meta)."""
    from peft import PeftModel
    from peft.tuners.tuners_utils import cast_adapter_dtype

    from halo_core.integrations import peft as _peft_seams  # noqa: F401  (checks the PEFT parts merged through here)
    from peft.utils import load_peft_weights, set_peft_model_state_dict

    try:
        wrapped = PeftModel.from_pretrained(copy.deepcopy(base.model), str(adapter_dir), low_cpu_mem_usage=True)
        wrapped._check_merge_allowed()
        # PEFT moves each adapter onto its base layer's device once loaded: here the meta device, where its values
        # would be lost. The same load again, the adapters left where they were read (the CPU).
        layers = [m for m in wrapped.modules() if hasattr(m, "_move_adapter_to_device_of_base_layer")]
        for layer in layers:
            layer._move_adapter_to_device_of_base_layer = lambda *args, **kwargs: None
        try:
            set_peft_model_state_dict(wrapped, load_peft_weights(str(adapter_dir), device="cpu"), adapter_name=ADAPTER, low_cpu_mem_usage=True)
        finally:
            for layer in layers:
                del layer._move_adapter_to_device_of_base_layer
    except (ValueError, RuntimeError, KeyError) as exc:
        reason = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        raise ConfigError(f"{adapter_dir}: PEFT cannot load this adapter over its base {base.name} "
                          f"({type(exc).__name__}: {reason[:400]})") from None
    missing = [n for n, p in wrapped.named_parameters() if f".{ADAPTER}." in n and p.device.type == "meta"
               and ".modules_to_save." not in n]
    if missing:
        raise ConfigError(f"{adapter_dir}/adapter_model.safetensors lacks {missing[0]} ({len(missing)} adapter weights in all); "
                          f"its adapter_config.json names targets it was not trained on")
    cast_adapter_dtype(wrapped, adapter_name=ADAPTER)  # over a real base PEFT loads the adapter into float32 layers
    return wrapped


def units_of(wrapped: nn.Module) -> tuple[dict[str, Unit], dict[str, torch.Tensor]]:
    """(merged name -> the ``Unit`` that changes it, merged name -> a ``modules_to_save`` copy's tensor, which
    ``merge_and_unload`` puts in place of the base module's)."""
    from peft.tuners.lora import LoraLayer, ParamWrapper
    from peft.utils.other import ModulesToSaveWrapper, TrainableTokensWrapper

    config = wrapped.peft_config[ADAPTER]
    if config.peft_type != "LORA":  # PeftType is a str enum
        raise ConfigError(f"halo export --merge merges LoRA adapters; this one is {config.peft_type}")
    if getattr(config, "layer_replication", None):
        raise ConfigError("halo export --merge does not merge an adapter with layer_replication (it changes the model's layers)")
    units, saved = {}, {}
    for path, module in wrapped.base_model.model.named_modules():
        if isinstance(module, TrainableTokensWrapper):
            raise ConfigError(f"halo export --merge does not merge trainable_token_indices ({path})")
        if isinstance(module, ModulesToSaveWrapper):
            for leaf, tensor in module.modules_to_save[ADAPTER].state_dict().items():
                if tensor.device.type != "meta":  # kept by the adapter; else the base's own
                    saved[f"{unwrapped(path)}.{leaf}"] = tensor
        elif isinstance(module, LoraLayer) and ADAPTER in module.lora_A:
            layer = module.get_base_layer()
            if isinstance(module, ParamWrapper):
                leaves = [module.parameter_name]
            else:
                leaves = ["weight"] + (["bias"] if module.lora_bias.get(ADAPTER) else [])
            unit = Unit(module, layer, {f"{unwrapped(path)}.{leaf}": leaf for leaf in leaves})
            for name in unit.leaves:
                if name in units:
                    raise ConfigError(f"{name} is adapted by two PEFT layers; halo export --merge merges one per weight")
                units[name] = unit
    return units, saved


@torch.no_grad()
def merge_unit(unit: Unit, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """PEFT's ``merge()`` of one layer over ``tensors`` (its base tensors, real), which it changes in place; the layer
    is left on the meta device again."""
    layer = unit.layer
    metas = {leaf: layer._parameters[leaf] for leaf in unit.leaves.values()}
    try:
        for name, leaf in unit.leaves.items():
            layer._parameters[leaf] = nn.Parameter(tensors[name], requires_grad=False)
        unit.peft_layer.merge(adapter_names=[ADAPTER])
        return {name: layer._parameters[leaf].data for name, leaf in unit.leaves.items()}
    finally:
        layer._parameters.update(metas)
        unit.peft_layer.merged_adapters.clear()


class MergedWeights:
    """``take(name)``: the merged model's tensor ``name`` (its state-dict name), read and merged on demand; what one
    read or one merge makes besides it (the other outputs of a converter, a layer's bias) waits for its own turn."""

    def __init__(self, base: Base, wrapped: nn.Module):
        self.base = base
        self.checkpoint = Checkpoint(base.folder, ReadLog())
        self.sources = conversion.sources(base.model, self.checkpoint.files)
        self.units, self.saved = units_of(wrapped)
        self.state = base.model.state_dict()
        self.buffers = dict(base.model.named_buffers())
        self.read_waiting: dict[str, torch.Tensor] = {}
        self.merged_waiting: dict[str, torch.Tensor] = {}

    def take(self, name: str) -> torch.Tensor:
        if name in self.merged_waiting:
            return self.merged_waiting.pop(name)
        if name in self.saved:  # modules_to_save: the adapter's copy, in the dtype the base module has
            return self.saved.pop(name).to(self.base.dtypes[name])
        unit = self.units.get(name)
        if unit is None:
            return self._read(name)
        merged = merge_unit(unit, {n: self._read(n) for n in unit.leaves})
        self.merged_waiting.update({n: t for n, t in merged.items() if n != name})
        return merged[name]

    def _read(self, name: str) -> torch.Tensor:
        """The base tensor ``name`` as ``from_pretrained`` loads it: converted, and cast to its load dtype."""
        if name in self.read_waiting:
            return self.read_waiting.pop(name)
        source = self.sources.get(name)
        if source is None:
            if name in self.buffers and self.buffers[name].device.type != "meta":
                return self.buffers[name].clone()  # a persistent buffer the checkpoint lacks keeps its built value
            raise CheckpointError(f"{self.base.folder} has no tensor that becomes {name}, as transformers' conversion mapping for "
                                  f"{self.base.model.config.model_type!r} renames its keys; is it the base this adapter was trained on?")
        shapes = {t: tuple(self.state[t].shape) for t in source.targets if t in self.state}
        try:
            with self.checkpoint.kept_open():
                made, _ = conversion.read(source, self.checkpoint.read, self.base.model, None, shapes)
        except conversion.MissingTensor as exc:
            raise CheckpointError(f"{self.base.folder} lacks {exc.args[0]} (needed for {name})") from None
        except (ValueError, RuntimeError, KeyError, StopIteration) as exc:
            keys = [k for ks in source.keys.values() for k in ks]
            raise CheckpointError(f"{name}: transformers' conversion of {keys[:2]}{'...' if len(keys) > 2 else ''} in {self.base.folder} "
                                  f"failed ({type(exc).__name__}: {exc}); is it a {self.base.model.config.model_type} checkpoint?") from None
        made = {t: v.to(self.base.dtypes[t]) if v.is_floating_point() else v for t, v in made.items() if t in self.state}
        self.read_waiting.update({t: v for t, v in made.items() if t != name})
        return made[name]
