"""transformers' private parts Halo uses: Trainer methods the mixin overrides or calls, attributes it reads, and the
experts interface (``transformers.integrations.moe``) that expert parallelism and the grouped LoRA recognise and call."""

from __future__ import annotations

from torch import nn
from transformers.integrations import moe

from halo_core.integrations import Seam, check

_TRAINER = "transformers:Trainer"

SEAMS = (
    # DistributedTrainerMixin (trainers/mixin.py) overrides these to save, load and clip over the layout's shards.
    Seam(_TRAINER, "_load_best_model", ()),
    Seam(_TRAINER, "_clip_grad_norm", ("model",)),
    Seam(_TRAINER, "_get_grad_norm", ("model", "grad_norm")),
    Seam(_TRAINER, "_get_output_dir", ("trial",)),
    Seam(_TRAINER, "_save_checkpoint", ("model", "trial")),
    Seam(_TRAINER, "_save_optimizer_and_scheduler", ("output_dir",)),
    Seam(_TRAINER, "_load_optimizer_and_scheduler", ("checkpoint",)),
    Seam(_TRAINER, "_load_rng_state", ("checkpoint",)),
    Seam(_TRAINER, "_load_from_checkpoint", ("resume_from_checkpoint", "model")),
    Seam(_TRAINER, "compute_loss", ("model", "inputs", "return_outputs", "num_items_in_batch")),
    # trainers/parts/nan_filter.py reads when the Trainer last logged; parts/evaluation.py whether its loss shifts labels.
    Seam(_TRAINER, "_globalstep_last_logged", assigned_in=True),
    Seam(_TRAINER, "_loss_shifts_labels", assigned_in=True),
    # The experts interface: grouped_experts.py and lora/grouped.py compute with transformers' own grouped matmul,
    # and replace the "grouped_mm" implementation where the model uses it.
    Seam("transformers.integrations.moe", "_grouped_linear", ("input", "weight", "offs", "bias", "is_transposed")),
    Seam("transformers.integrations.moe", "ALL_EXPERTS_FUNCTIONS"),
    Seam("transformers.integrations.moe", "use_experts_implementation",
         ("experts_class", "experts_interface", "is_concatenated", "is_transposed", "has_bias", "has_gate")),
)

check("transformers", SEAMS)

#: transformers' grouped matmul over rows grouped by expert (``offs``: each group's end), as its ``grouped_mm`` calls it.
grouped_linear = moe._grouped_linear
#: The experts implementations by name (``"grouped_mm"``, ``"batched_mm"``, ...).
EXPERTS_FUNCTIONS = moe.ALL_EXPERTS_FUNCTIONS


def is_experts(module: nn.Module) -> bool:
    """A transformers experts module (``@use_experts_implementation``) with fused 3-D weights.

    transformers marks such a class only by what the decorator leaves: the interface's flags (``is_transposed``) on the
    instance and a wrapped ``forward`` on the class."""
    return hasattr(module, "is_transposed") and hasattr(type(module).forward, "__wrapped__") and any(
        p.dim() == 3 for p in module.parameters(recurse=False))
