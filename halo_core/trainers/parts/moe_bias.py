"""DeepSeek-V3's auxiliary-loss-free balancing (``moe_bias_update_rate``), in the slot stock modeling reads.

Families whose router adds a per-expert bias to its scores for the top-k choice only (transformers'
``e_score_correction_bias`` buffer: DeepSeek-V3, GLM-4 MoE, Kimi, Ling and others) balance without a loss term:
after every optimizer step each bias moves by ``rate * sign(mean load - expert's load)``, the loads counted over the
step's global batch (``parts.moe_load``, the same tokens on every layout). Every rank holds the whole router, so
every rank applies the same update from the one all-reduced count, on the device. The buffer is the model's own:
``save_pretrained`` writes it, and stock ``from_pretrained`` routes with it.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from halo_core.errors import ConfigError

SLOT = "e_score_correction_bias"
FIELD = "moe_bias_update_rate"


def update(bias: torch.Tensor, counts: torch.Tensor, rate: float) -> None:
    """One step of the rule, in place: ``bias += rate * sign(mean(counts) - counts)``."""
    counts = counts.to(device=bias.device, dtype=torch.float32)
    bias.add_(torch.sign(counts.mean() - counts).to(bias.dtype), alpha=rate)


def biased_layers(model, load) -> list[tuple[int, torch.Tensor]]:
    """(layer of ``load``, the router's bias buffer) for each experts module whose block's router has the slot."""
    found = []
    for layer, name in enumerate(load.names):
        block = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
        for child in block.children():
            bias = getattr(child, SLOT, None)
            if isinstance(bias, torch.Tensor) and bias.dim() == 1 and bias.shape[0] == load.sizes[layer]:
                found.append((layer, bias))
                break
    return found


class BiasUpdate(TrainerCallback):
    """At every optimizer step's end: the step's global loads, one all-reduce, every biased router updated."""

    def __init__(self, load, model, rate: float) -> None:
        self.load, self.rate = load, rate
        self.biases = biased_layers(model, load)
        load.track_steps = True

    def on_step_end(self, args, state, control, **kwargs):
        table = self.load.step_table(args.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(table)
            table = table / self.load.layout.dims.tp
        for layer, bias in self.biases:
            update(bias, table[layer, : self.load.sizes[layer]], self.rate)
        return control


def attach(trainer, rate: float) -> None:
    """Turn balancing on for ``trainer`` (after ``moe_load.install``); the families were checked before start."""
    if not rate:
        return
    load = trainer._halo_moe
    callback = BiasUpdate(load, trainer._halo_laid_out, rate) if load is not None else None
    if callback is None or not callback.biases:
        raise ConfigError(f"{FIELD}={rate}: no router of {type(trainer._halo_laid_out).__name__} has a per-expert routing bias ({SLOT}); "
                          f"set it to 0, or train a family that has one: {', '.join(families_with_bias())}")
    trainer.add_callback(callback)


# -- before start -----------------------------------------------------------------------------------------


@functools.cache
def families_with_bias() -> tuple[str, ...]:
    """transformers' model types whose modeling reads the slot (found in its installed modeling sources)."""
    import transformers.models as models

    root = Path(models.__path__[0])
    return tuple(sorted(p.parent.name for p in root.glob("*/modeling_*.py") if SLOT in p.read_text(errors="ignore")))


def _model_types(folder: Path) -> list[str]:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return []
    types = [config.get("model_type")]
    types += [sub.get("model_type") for sub in config.values() if isinstance(sub, dict) and "model_type" in sub]
    return [t for t in types if t]


def check_key(run) -> None:
    """Before start: the rate is a number >= 0, and where it is on, the model's family reads a routing bias."""
    rate = run.halo.moe_bias_update_rate
    if not isinstance(rate, (int, float)) or rate < 0:
        raise ConfigError(f"{run.source}: {FIELD}={rate!r} must be 0 (off) or a positive step, e.g. 0.001 (DeepSeek-V3's)")
    if not rate:
        return
    folder = Path(run.halo.model_name_or_path)
    types = _model_types(folder) if folder.is_dir() else []
    if not types:
        return  # a hub id: checked when the model is built (the trainer finds no biased router)
    having = families_with_bias()
    if not any(t in having for t in types):
        raise ConfigError(f"{run.source}: {FIELD}={rate} needs a router with a per-expert routing bias ({SLOT}), and "
                          f"{types[0]} has none: set it to 0 (use router_aux_loss_coef to balance), or train a family that has one: "
                          f"{', '.join(having)}")
