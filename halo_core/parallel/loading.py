"""``from_pretrained(path, ParallelConfig(...))``: a Hugging Face checkpoint straight into a parallel layout.

The model is built with its parameters on the meta device (buffers real), laid out by
``parallelize``, materialised, and filled from the safetensors files: every rank reads
the non-expert tensors and only its own block of experts. Checkpoints that store experts
fused (``...experts.gate_up_proj``) are sliced on read; checkpoints that store one tensor
per expert (``...experts.7.gate_proj.weight``, what transformers writes for Qwen3-MoE)
are read for the local experts only and merged as transformers' own conversion mapping
for the model type says (``MergeModulelist`` then ``Concatenate``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from halo_core.errors import HaloError
from halo_core.parallel.config import ParallelConfig
from halo_core.parallel.expert_tensor_parallel import take_slice
from halo_core.parallel.layout_state import layout_of
from halo_core.parallel.parallelize import parallelize


class CheckpointError(HaloError):
    """A checkpoint the sliced loader cannot map onto the model."""


@dataclass
class ReadLog:
    """What one rank read: checkpoint key -> rows read along dim 0 (``None`` = whole tensor)."""

    reads: dict[str, tuple[int, int] | None] = field(default_factory=dict)


class Checkpoint:
    """Lazy access to the tensors of a safetensors checkpoint folder (single file or sharded index)."""

    def __init__(self, folder: Path, log: ReadLog) -> None:
        index = folder / "model.safetensors.index.json"
        if index.exists():
            self.files = {k: folder / f for k, f in json.loads(index.read_text())["weight_map"].items()}
        else:
            single = folder / "model.safetensors"
            if not single.exists():
                raise CheckpointError(f"{folder} has neither model.safetensors nor model.safetensors.index.json")
            with safe_open(single, "pt") as handle:
                self.files = {k: single for k in handle.keys()}
        self.log = log
        self.folder = folder

    def __contains__(self, key: str) -> bool:
        return key in self.files

    def read(self, key: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
        with safe_open(self.files[key], "pt") as handle:
            tensor = handle.get_slice(key)[rows[0] : rows[1]] if rows else handle.get_tensor(key)
        self.log.reads[key] = rows
        return tensor


def _conversions(model_type: str) -> list:
    """transformers' conversion mapping for ``model_type``, then those of its sub-configs' types: transformers applies a
    composite's text-part mapping to that part's keys (``qwen3_5_moe`` has none of its own, and its checkpoints store
    the language model's experts one tensor each, as ``qwen3_5_moe_text``'s mapping reads them)."""
    from transformers import CONFIG_MAPPING
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    found = list(get_checkpoint_conversion_mapping(model_type) or [])
    config_class = CONFIG_MAPPING[model_type] if model_type in CONFIG_MAPPING else None
    for sub in (getattr(config_class, "sub_configs", None) or {}).values():
        sub_type = getattr(getattr(sub, "config_class", sub), "model_type", None)
        if sub_type and sub_type != model_type:
            found += get_checkpoint_conversion_mapping(sub_type) or []
    return found


def _expert_converter(model_type: str, name: str):
    """transformers' converter producing the fused parameter ``name`` from per-expert tensors, if any."""
    for transform in _conversions(model_type):
        if type(transform).__name__ != "WeightConverter":
            continue
        for target in transform.target_patterns:
            if name.endswith(target.lstrip(".")):
                return transform, name[: len(name) - len(target.lstrip("."))]
    return None, None


def _same_name_conversion(model_type: str, name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``tensor`` as transformers' loading would leave it where the checkpoint stores ``name`` under its own name in
    another layout (qwen3_vl_moe's experts, saved as [E, H, 2I] for a [E, 2I, H] parameter): its ``Transpose``
    steps, applied as transformers applies them (with ``check_dims``, only where the trailing shape differs)."""
    converter, _ = _expert_converter(model_type, name)
    if converter is None or list(converter.source_patterns) != list(converter.target_patterns):
        return tensor
    for operation in converter.operations:
        if type(operation).__name__ != "Transpose":
            raise CheckpointError(f"{name}: transformers converts it in place with {type(operation).__name__}, which the "
                                  f"sliced loader does not apply; load with transformers' from_pretrained, then parallelize()")
        if not operation.check_dims or tuple(tensor.shape[1:]) != tuple(shape[1:]):
            tensor = tensor.transpose(operation.dim0, operation.dim1).contiguous()
    return tensor


def _read_expert_block(checkpoint: Checkpoint, model_type: str, name: str, rows: tuple[int, int], shape: tuple[int, ...]) -> torch.Tensor:
    """Experts ``rows[0]..rows[1]-1`` of the fused parameter ``name`` (of global ``shape``), sliced or merged on read."""
    if name in checkpoint:
        return _same_name_conversion(model_type, name, checkpoint.read(name, rows), shape)
    converter, prefix = _expert_converter(model_type, name)
    if converter is None:
        raise CheckpointError(
            f"{name} is not in {checkpoint.folder} and no transformers conversion for {model_type!r} produces it; "
            f"is this a {model_type} checkpoint written by transformers?"
        )
    pieces = []
    for pattern in converter.source_patterns:
        keys = [prefix + pattern.lstrip(".").replace("*", str(expert)) for expert in range(*rows)]
        missing = [k for k in keys if k not in checkpoint]
        if missing:
            raise CheckpointError(f"checkpoint lacks {missing[0]} (needed for {name}); it does not match {model_type!r}'s layout")
        pieces.append([checkpoint.read(k) for k in keys])
    tensors = None
    for operation in converter.operations:
        kind = type(operation).__name__
        if kind == "MergeModulelist":
            tensors = [torch.stack(p, dim=operation.dim) for p in pieces]
        elif kind == "Concatenate" and tensors is not None:
            tensors = [torch.cat(tensors, dim=operation.dim)]
        else:
            raise CheckpointError(
                f"{name}: transformers converts it with {kind}, which the sliced loader does not apply; "
                f"load with transformers' from_pretrained, then parallelize()"
            )
    if tensors is None or len(tensors) != 1:
        raise CheckpointError(f"{name}: transformers' conversion for {model_type!r} does not end in one tensor")
    return tensors[0]


def build_from_config(model_class, hf_config, **kwargs):
    """A randomly initialised model of ``model_class`` (an auto class, or a family's concrete ``model_class``):
    concrete transformers classes build from a config with ``_from_config``, only auto classes have ``from_config``."""
    build = getattr(model_class, "from_config", None) or model_class._from_config
    return build(hf_config, **kwargs)


def model_class_for(hf_config, registry=None, sequence_classification: bool = False):
    """The class to build a model of this config with: the family's ``model_class`` for its model type where it names
    one (``Family.class_for``: a family may build its composite and its text part with different classes).

    ``sequence_classification``: the family's backbone under a classification head (``score``, ``num_labels``
    outputs read at the last non-pad token), the class transformers' ``AutoModelForSequenceClassification``
    maps the config to; a ``CheckpointError`` if transformers has none for the model type.
    """
    import transformers

    from halo_core.registry import discover

    if sequence_classification:
        from transformers import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING

        if type(hf_config) not in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING:
            raise CheckpointError(
                f"transformers has no sequence-classification class for model type {hf_config.model_type!r} "
                f"(AutoModelForSequenceClassification); train it with a causal-LM method (sft, dpo) instead"
            )
        return transformers.AutoModelForSequenceClassification

    record = (registry or discover()).family_record(hf_config.model_type)
    name = record.family.class_for(hf_config.model_type) if record is not None and record.ok else None
    return getattr(transformers, name) if name else transformers.AutoModelForCausalLM


@torch.no_grad()
def from_pretrained(
    path: str | Path, config: ParallelConfig, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
    registry=None, experts_implementation: str | None = None, num_labels: int | None = None, pad_token_id: int | None = None,
    seed: int = 0,
):
    """Load ``path`` into the layout ``config`` describes, reading only this rank's experts; call on every rank.

    ``num_labels``: build the sequence-classification class instead (``model_class_for``), with
    ``pad_token_id`` on its config (it reads the score at the last non-pad token); from a causal LM's
    checkpoint the backbone loads and the head, which it lacks, is initialised from ``seed`` (``load_into``).
    """
    from accelerate import init_empty_weights
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(path)
    if num_labels is not None:
        sequence_head(hf_config, num_labels, pad_token_id)
    extra = {"experts_implementation": experts_implementation} if experts_implementation else {}
    with init_empty_weights(include_buffers=False):
        model = build_from_config(model_class_for(hf_config, registry, num_labels is not None), hf_config, dtype=dtype, **extra)
    model = parallelize(model, config, registry, device_type=torch.device(device).type)
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    model.to_empty(device=device)
    for name, buffer in model.named_buffers():
        buffer.copy_(buffers[name])
    load_into(model, path, new_head_seed=seed if num_labels is not None else None)
    return model


def sequence_head(hf_config, num_labels: int, pad_token_id: int | None) -> None:
    """What a sequence-classification head reads off the config: its outputs, and the pad token it skips."""
    hf_config.num_labels = num_labels
    if pad_token_id is not None:
        hf_config.pad_token_id = pad_token_id
        hf_config.get_text_config().pad_token_id = pad_token_id


def expert_rows(model: nn.Module, name: str) -> tuple[int, int] | None:
    """The rows along dim 0 of the parameter ``name`` that this rank's experts hold; ``None`` if it is not expert-sharded."""
    if name not in layout_of(model).expert_params:
        return None
    return layout_of(model).expert_rows(name)


def _unsliced_shape(model: nn.Module, name: str, param: torch.Tensor) -> tuple[int, ...]:
    """``param``'s shape before its ETP slice (a DTensor's is already global): the shape a checkpoint block is read at."""
    shape = list(param.shape)
    if name in layout_of(model).expert_params:
        shard = layout_of(model).expert_shard(name)
        split = shard.etp_splits.get(name.rsplit(".", 1)[1])
        if split is not None:
            shape[split.dim] *= shard.etp_size
    return tuple(shape)


def place(model: nn.Module, name: str, param: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    """``block`` (whole, or this rank's experts of an expert parameter) laid out like ``param``.

    Its ETP slice, then its DTensor shard (a DTensor with ``param``'s mesh and placements) for
    a DTensor ``param``. The dtype is left as it is: weights take the parameter's, optimizer
    state keeps its own.
    """
    if name in layout_of(model).expert_params:
        shard = layout_of(model).expert_shard(name)
        split = shard.etp_splits.get(name.rsplit(".", 1)[1])
        if split is not None:
            block = take_slice(block, split, shard.etp_rank, shard.etp_size)
    block = block.to(param.device)
    if isinstance(param, DTensor):
        return distribute_tensor(block, param.device_mesh, param.placements, src_data_rank=None)
    return block


def _new_head_block(model: nn.Module, name: str, seed: int) -> torch.Tensor | None:
    """A head parameter (outside the backbone, ``base_model_prefix``) the checkpoint lacks, initialised whole as
    transformers initialises missing keys (the model's ``_init_weights`` on the module), the same on every rank."""
    prefix = getattr(model, "base_model_prefix", "")
    if not prefix or name.startswith(prefix + "."):
        return None
    owner_name, _, leaf = name.rpartition(".")
    owner = model.get_submodule(owner_name)
    if not isinstance(owner, nn.Linear):
        return None
    replica = nn.Linear(owner.in_features, owner.out_features, bias=owner.bias is not None, dtype=torch.float32)
    torch.manual_seed(seed)
    model._init_weights(replica)
    return getattr(replica, leaf).detach()


@torch.no_grad()
def load_into(model: nn.Module, path: str | Path, new_head_seed: int | None = None) -> ReadLog:
    """Fill a laid-out model's parameters from a Hugging Face checkpoint folder, reading only local experts.

    Also used to resume training from a ``checkpoint-N`` folder. Returns (and keeps in the
    layout as ``reads``) what this rank read. ``new_head_seed``: a linear head outside the backbone that
    the checkpoint lacks (a causal LM read into a sequence-classification class) is initialised from it.
    """
    folder = Path(path)
    model_type = model.config.model_type
    log = ReadLog()
    checkpoint = Checkpoint(folder, log)
    layout = layout_of(model)
    tied = getattr(model, "_tied_weights_keys", None) or {}
    for name, param in model.named_parameters():
        rows = expert_rows(model, name)
        if rows is not None:
            block = _read_expert_block(checkpoint, model_type, name, rows, _unsliced_shape(model, name, param))
        elif name in checkpoint:
            block = _same_name_conversion(model_type, name, checkpoint.read(name), _unsliced_shape(model, name, param))
        elif name in tied:
            continue  # filled by its tie
        elif new_head_seed is not None and (fresh := _new_head_block(model, name, new_head_seed)) is not None:
            block = fresh
        else:  # fused experts without EP, or another converted tensor
            block = _read_expert_block(checkpoint, model_type, name, (0, param.shape[0]), _unsliced_shape(model, name, param))
        local = place(model, name, param, block.to(dtype=param.dtype))
        if isinstance(param, DTensor):
            param.to_local().copy_(local.to_local())
        else:
            param.copy_(local)
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    layout.reads.clear()
    layout.reads.update(log.reads)
    return log
