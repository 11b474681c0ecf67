"""``from_pretrained(path, ParallelConfig(...))``: a Hugging Face checkpoint straight into a parallel layout.

The model is built with its parameters on the meta device (buffers real), laid out by
``parallelize``, materialised, and filled from the safetensors files: every rank reads
the non-expert tensors and only its own block of experts. Keys are renamed and converted as
transformers' own conversion mapping says (``conversion``): experts stored fused are sliced on
read, experts stored one tensor each (what transformers writes for Qwen3-MoE and Mixtral) are
read for the local experts only and merged as the mapping merges them.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from halo_core.errors import HaloError
from halo_core.parallel import conversion, manifest
from halo_core.parallel.config import ParallelConfig
from halo_core.parallel.expert_tensor_parallel import take_slice
from halo_core.parallel.layout_state import layout_of
from halo_core.parallel.parallelize import parallelize
from halo_core.parallel.safetensors_parallel import CorruptTensor, verify


#: Suffixes of an MXFP4 weight's two tensors (packed FP4 pairs, and one exponent per 32 values).
MXFP4_BLOCKS, MXFP4_SCALES = "_blocks", "_scales"
#: The quantisation Halo reads by dequantising to bf16 on load (transformers' ``Mxfp4Config(dequantize=True)``).
DEQUANTISED_ON_LOAD = ("mxfp4",)


def drop_dequantised(hf_config) -> None:
    """Forget a quantisation the loader undoes (MXFP4), so the model trains and saves plain weights; refuse others."""
    settings = getattr(hf_config, "quantization_config", None)
    if not settings:
        return
    method = settings.get("quant_method") if isinstance(settings, dict) else getattr(settings, "quant_method", None)
    if str(getattr(method, "value", method)) not in DEQUANTISED_ON_LOAD:
        raise CheckpointError(f"a quantised checkpoint ({method!r}); the sliced loader dequantises only {list(DEQUANTISED_ON_LOAD)}: "
                              f"dequantise it first (transformers' from_pretrained, then save_pretrained)")
    del hf_config.quantization_config


class CheckpointError(HaloError):
    """A checkpoint the sliced loader cannot map onto the model."""


@dataclass
class ReadLog:
    """What one rank read: checkpoint key -> rows read along dim 0 (``None`` = whole tensor)."""

    reads: dict[str, tuple[int, int] | None] = field(default_factory=dict)


class Checkpoint:
    """Lazy access to the tensors of a safetensors checkpoint folder (single file or sharded index); where the folder
    has Halo's manifest, every part read is checked against the CRC-32 its writer recorded (``manifest``)."""

    def __init__(self, folder: Path, log: ReadLog) -> None:
        index = folder / "model.safetensors.index.json"
        if index.exists():
            self.files = {k: folder / f for k, f in json.loads(index.read_text())["weight_map"].items()}
        else:
            single = folder / "model.safetensors"
            if not single.exists():
                raise CheckpointError(f"{folder} has neither model.safetensors nor model.safetensors.index.json")
            try:
                with safe_open(single, "pt") as handle:
                    self.files = {k: single for k in handle.keys()}
            except Exception as exc:  # safetensors' own error names no file
                raise CheckpointError(f"{single} cannot be read ({type(exc).__name__}: {exc}); the file is truncated or damaged") from None
        self.log = log
        self.folder = folder
        #: MXFP4 weights (gpt-oss's release): ``K`` stored as ``K_blocks`` and ``K_scales``, read dequantised as ``K``.
        self.mxfp4 = {k[: -len(MXFP4_BLOCKS)] for k in self.files if k.endswith(MXFP4_BLOCKS) and k[: -len(MXFP4_BLOCKS)] + MXFP4_SCALES in self.files}
        self.files.update({k: self.files[k + MXFP4_BLOCKS] for k in self.mxfp4})
        self._open: dict[Path, object] | None = None
        try:
            self.manifest = manifest.read(folder)
        except manifest.ManifestError as exc:
            raise CheckpointError(str(exc)) from None

    def __contains__(self, key: str) -> bool:
        return key in self.files

    @contextlib.contextmanager
    def kept_open(self):
        """Each file opened once for the reads inside (a file's header is parsed on every open: thousands of tensors
        read one open each cost seconds), and closed after, so its mapped pages do not stay resident."""
        self._open = {}
        try:
            yield self
        finally:
            handles, self._open = self._open, None
            for handle in handles.values():
                handle.__exit__(None, None, None)

    def _handle(self, path: Path):
        if self._open is None:
            return safe_open(path, "pt")
        if path not in self._open:
            self._open[path] = safe_open(path, "pt").__enter__()
        return contextlib.nullcontext(self._open[path])

    def read(self, key: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
        if key in self.mxfp4:  # this rank's experts' blocks and scales, dequantised as transformers' MXFP4 loader does
            from transformers.integrations.mxfp4 import convert_moe_packed_tensors

            blocks, scales = self.read(key + MXFP4_BLOCKS, rows), self.read(key + MXFP4_SCALES, rows)
            self.log.reads[key] = rows
            return convert_moe_packed_tensors(blocks, scales, dtype=torch.bfloat16)
        path = self.files[key]
        parts = (manifest.parts_of(self.manifest, path.relative_to(self.folder).as_posix()) or {}).get(key)
        try:
            with self._handle(path) as handle:
                if parts is None:
                    tensor = handle.get_slice(key)[rows[0] : rows[1]] if rows else handle.get_tensor(key)
                else:
                    tensor = verify(key, parts, lambda span: handle.get_slice(key)[span[0] : span[1]] if span else handle.get_tensor(key), rows)
        except CorruptTensor as exc:
            raise CheckpointError(f"{path}: {exc}; the file is damaged (re-copy it, or resume from another checkpoint)") from None
        except Exception as exc:  # safetensors' own errors name neither the file nor the tensor
            raise CheckpointError(f"{path}: reading {key} failed ({type(exc).__name__}: {exc}); the file is truncated or damaged") from None
        self.log.reads[key] = rows
        return tensor


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
    try:
        drop_dequantised(hf_config)
    except CheckpointError as exc:
        raise CheckpointError(f"{path} is {exc}") from None
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


def _whole_shape(model: nn.Module, name: str, param: torch.Tensor) -> tuple[int, ...]:
    """``param``'s shape on one process: every expert's rows, no ETP slice."""
    shape = list(_unsliced_shape(model, name, param))
    if name in layout_of(model).expert_params:
        shard = layout_of(model).expert_shard(name)
        shape[0] = shape[0] // shard.count * shard.num_experts
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
    """Fill a laid-out model's weights (and persistent buffers: DeepSeek's routing correction bias) from a Hugging Face
    checkpoint folder, reading only local experts, its keys renamed and converted as transformers' own conversion
    mapping says (``conversion``).

    Also used to resume training from a ``checkpoint-N`` folder. Returns (and keeps in the
    layout as ``reads``) what this rank read. ``new_head_seed``: a linear head outside the backbone that
    the checkpoint lacks (a causal LM read into a sequence-classification class) is initialised from it.
    A buffer the checkpoint lacks keeps the value the model was built with, as transformers' loading keeps it.
    """
    folder = Path(path)
    log = ReadLog()
    checkpoint = Checkpoint(folder, log)
    layout = layout_of(model)
    found = conversion.sources(model, checkpoint.files)
    tied = getattr(model, "_tied_weights_keys", None) or {}
    buffers = dict(model.named_buffers())
    weights = dict([*model.named_parameters(), *((n, t) for n in model.state_dict() if (t := buffers.get(n)) is not None)])
    converted: dict[int, tuple[dict, bool]] = {}  # a converter's other outputs (q, k, v of one qkv), until taken
    for name, tensor in weights.items():
        source = found.get(name)
        if source is None:
            if name in tied or name in buffers:
                continue  # filled by its tie / kept as built
            fresh = _new_head_block(model, name, new_head_seed) if new_head_seed is not None else None
            if fresh is None:
                raise CheckpointError(
                    f"{folder} has no tensor that becomes {name}, as transformers' conversion mapping for "
                    f"{model.config.model_type!r} renames its keys; is this a {model.config.model_type} checkpoint written by transformers?"
                )
            block = fresh
        else:
            block = _read(model, checkpoint, source, name, weights, converted)
        local = place(model, name, tensor, block.to(dtype=tensor.dtype))
        target = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        target.copy_(local.to_local() if isinstance(local, DTensor) else local)
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    layout.reads.clear()
    layout.reads.update(log.reads)
    return log


def _read(model: nn.Module, checkpoint: Checkpoint, source: conversion.Source, name: str, weights: dict, converted: dict) -> torch.Tensor:
    """Weight ``name``'s block on this rank (whole, or its experts' rows) from ``source``; a converter's outputs are
    made once, the other weights it makes (with this rank's experts where it read only those) kept for their turn."""
    rows = expert_rows(model, name)
    if name in converted.get(id(source), ({}, False))[0]:
        blocks, sliced = converted[id(source)]
    else:
        blocks, sliced = _convert(model, checkpoint, source, name, rows, weights)
        converted[id(source)] = (blocks, sliced)
    block = blocks.pop(name)
    return block[rows[0] : rows[1]] if rows is not None and not sliced else block


def _convert(model: nn.Module, checkpoint: Checkpoint, source: conversion.Source, name: str, rows, weights: dict):
    shapes = {t: _whole_shape(model, t, weights[t]) for t in source.targets if t in weights}
    try:
        return conversion.read(source, checkpoint.read, model, rows, shapes)
    except conversion.MissingTensor as exc:
        raise CheckpointError(f"checkpoint lacks {exc.args[0]} (needed for {name}); it does not match {model.config.model_type!r}'s layout") from None
    except (ValueError, RuntimeError, KeyError, StopIteration) as exc:
        keys = [k for ks in source.keys.values() for k in ks]
        raise CheckpointError(f"{name}: transformers' conversion of {keys[:2]}{'...' if len(keys) > 2 else ''} failed here "
                              f"({type(exc).__name__}: {exc}); does the checkpoint match {model.config.model_type!r}'s layout?") from None
