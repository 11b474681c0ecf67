"""A LoRA run's refusals before any process starts: each one line naming the key, the value and the fix."""

from __future__ import annotations

import copy
from pathlib import Path

from halo_core.errors import ConfigError
from halo_core.lora import settings
from halo_core.parallel.plan import GROUPED_MM_ALIGNMENT
from halo_core.trainers.method import get_method
from halo_core.trainers.run_config import method_config, model_config_of


def check_lora(run, world: int = 1, plan=None) -> None:
    """``plan``: the launch's ``RunPlan``, whose model config and precision are read once for all the checks."""
    import torch  # here, not at import: the CLI imports the checks, and only a LoRA run needs torch

    fields = run.peft
    if not fields.get("use_peft"):
        if run.halo.merge_adapter:
            raise ConfigError(f"{run.source}: merge_adapter: true merges a LoRA adapter, but the run trains every weight (no use_peft: true); "
                              f"remove merge_adapter, or set use_peft: true")
        return
    where = run.source
    for key in ("load_in_4bit", "load_in_8bit"):
        if fields.get(key):
            if not torch.cuda.is_available():
                raise ConfigError(f"{where}: {key}: true quantises the frozen base with bitsandbytes on a GPU, and this machine has none; set {key}: false")
            raise ConfigError(f"{where}: {key}: true (QLoRA) is not supported by Halo yet: the base stays in the run's dtype; set {key}: false")
    r = fields.get("lora_r", 16)
    if r < 1:
        raise ConfigError(f"{where}: lora_r={r} must be a positive integer (the adapters' rank), e.g. 16")
    dropout = fields.get("lora_dropout", 0.05)
    if not 0 <= dropout < 1:
        raise ConfigError(f"{where}: lora_dropout={dropout} must be in [0, 1), e.g. 0.0 or 0.05")
    if fields.get("use_dora"):
        raise ConfigError(f"{where}: use_dora: true (DoRA) is not supported on Halo's layouts; set use_dora: false")
    try:
        config = settings.lora_config(fields)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{where}: the LoRA keys do not make a peft.LoraConfig: {' '.join(str(exc).split())}") from None
    model = _meta_model(run, plan)
    if model is not None:
        _check_targets(run, model, config, world, plan)


def _meta_model(run, plan=None):
    """The run's model with no memory behind it (parameters on the meta device), to match targets against."""
    import torch

    from halo_core.parallel.loading import build_from_config, model_class_for, sequence_head

    folder = Path(run.halo.model_name_or_path)
    if not (folder / "config.json").exists():
        return None  # a hub id: the worker checks when it loads
    hf_config = plan.model_config if plan is not None else model_config_of(run)
    head = get_method(run.method).sequence_classification
    if head:
        hf_config = copy.deepcopy(hf_config)  # the plan's copy stays the model's own for the checks after this one
        sequence_head(hf_config, 2, hf_config.pad_token_id)  # the head's width does not change what targets match
    extra = {"experts_implementation": run.halo.experts_implementation} if run.halo.experts_implementation else {}
    with torch.device("meta"):
        return build_from_config(model_class_for(hf_config, sequence_classification=head), hf_config, **extra)


def _check_targets(run, model, config, world: int = 1, plan=None) -> None:
    from halo_core.lora.inject import LoraError, experts_outside_interface, for_model, inject_dense, inject_parameter, plan_targets, refuse_split_experts

    config = for_model(config, model)
    try:
        targets = plan_targets(model, config)
        if run.halo.parallel_config().ep != 1:
            refuse_split_experts(targets.parameters, experts_outside_interface(model))
        if targets.dense is not None:
            inject_dense(model, targets.dense)
        for key in targets.parameters:
            if key.rsplit(".", 1)[0] not in targets.experts:
                inject_parameter(model, config, key)
    except LoraError as exc:
        raise ConfigError(f"{run.source}: {exc}") from None
    if not targets.experts:
        return
    implementation = run.halo.experts_implementation
    if implementation not in (None, "grouped_mm"):
        raise ConfigError(f"{run.source}: experts_implementation={implementation!r}: LoRA on fused experts runs in the grouped GEMM; "
                          f"set experts_implementation: grouped_mm (or leave it empty)")
    from halo_core.lora.inject import _rank_and_alpha

    itemsize = 2 if (plan.bf16 if plan is not None else method_config(run, world).bf16) else 4
    for key in targets.parameters:
        rank, _ = _rank_and_alpha(config, key)
        if key.rsplit(".", 1)[0] in targets.experts and rank * itemsize % GROUPED_MM_ALIGNMENT:
            step = GROUPED_MM_ALIGNMENT // itemsize
            raise ConfigError(f"{run.source}: lora_r={run.peft.get('lora_r', 16)} gives {key} adapters of rank {rank}, {rank * itemsize} bytes "
                              f"a row at {itemsize} bytes an element, but grouped_mm needs rows of a multiple of {GROUPED_MM_ALIGNMENT} bytes; "
                              f"choose lora_r a multiple of {step}")
